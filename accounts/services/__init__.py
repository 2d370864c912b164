"""Writes of the accounts app, one module per concern; the public ones are re-exported here."""

from accounts.ledger import BudgetExhausted, PriorityCharge, Settled
from accounts.services.budgets import budget_hold, budget_set, hold_release
from accounts.services.invoices import invoice_generate, month_bounds, previous_month_bounds
from accounts.services.keys import api_key_authenticate, api_key_create, api_key_revoke
from accounts.services.settlement import (
    Opening,
    Served,
    UnknownRequest,
    holds_sweep,
    request_fail,
    request_open,
    request_settle,
    requests_open,
    requests_open_first,
    requests_settle,
    requests_settle_first,
    token_charge,
)
from accounts.services.tenants import (
    DEMO_OPERATOR,
    DEMO_TENANTS,
    demo_accounts_seed,
    tenant_ensure,
)

__all__ = [
    "DEMO_OPERATOR",
    "DEMO_TENANTS",
    "BudgetExhausted",
    "PriorityCharge",
    "Opening",
    "Served",
    "Settled",
    "UnknownRequest",
    "api_key_authenticate",
    "api_key_create",
    "api_key_revoke",
    "budget_hold",
    "budget_set",
    "demo_accounts_seed",
    "hold_release",
    "holds_sweep",
    "invoice_generate",
    "month_bounds",
    "previous_month_bounds",
    "request_fail",
    "request_open",
    "requests_open",
    "requests_open_first",
    "request_settle",
    "requests_settle",
    "requests_settle_first",
    "tenant_ensure",
    "token_charge",
]
