"""Tenants and their members. Later: roles, API keys, budgets, the ledger and invoices."""
