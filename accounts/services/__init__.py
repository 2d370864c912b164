"""Writes of the accounts app, one module per concern; the public ones are re-exported here."""

from accounts.ledger import BudgetExhausted, PriorityCharge, Settled, Usage
from accounts.services.budgets import budget_hold, budget_set, hold_release
from accounts.services.invoices import invoice_generate, month_bounds, previous_month_bounds
from accounts.services.keys import api_key_authenticate, api_key_create, api_key_revoke
from accounts.services.settlement import (
    UnknownRequest,
    holds_sweep,
    request_fail,
    request_open,
    request_settle,
    token_charge,
)
from accounts.services.tenants import (
    DEMO_OPERATOR,
    DEMO_TENANTS,
    DemoLogin,
    demo_accounts_seed,
    membership_ensure,
    tenant_ensure,
)

__all__ = [
    "DEMO_OPERATOR",
    "DEMO_TENANTS",
    "BudgetExhausted",
    "DemoLogin",
    "PriorityCharge",
    "Settled",
    "UnknownRequest",
    "Usage",
    "api_key_authenticate",
    "api_key_create",
    "api_key_revoke",
    "budget_hold",
    "budget_set",
    "demo_accounts_seed",
    "hold_release",
    "holds_sweep",
    "invoice_generate",
    "membership_ensure",
    "month_bounds",
    "previous_month_bounds",
    "request_fail",
    "request_open",
    "request_settle",
    "tenant_ensure",
    "token_charge",
]
