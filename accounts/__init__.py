"""Tenants, members and roles, API keys, budgets and holds, the ledger, and invoices."""
