"""Reads of the accounts app, one module per concern; the public ones are re-exported here."""

from accounts.selectors.billing import (
    api_key_for_tenant,
    api_keys_for_tenant,
    invoice_for_tenant,
    invoice_lines,
    invoices_for_tenant,
)
from accounts.selectors.budgets import (
    BudgetStatus,
    budget_status,
    budget_statuses_for_tenant,
    budget_usage,
    budgets_applying,
)
from accounts.selectors.dashboards import (
    HourSpend,
    MarketCharges,
    TopRequest,
    charges_by_market,
    spend_per_hour,
    top_requests_by_priority,
)
from accounts.selectors.tenants import (
    OPERATOR,
    can_manage_keys,
    role_for_user,
    tenant_for_user,
    tenants_for_user,
    tenants_visible_to,
)

__all__ = [
    "OPERATOR",
    "BudgetStatus",
    "HourSpend",
    "MarketCharges",
    "TopRequest",
    "api_key_for_tenant",
    "api_keys_for_tenant",
    "budget_status",
    "budget_statuses_for_tenant",
    "budget_usage",
    "budgets_applying",
    "can_manage_keys",
    "charges_by_market",
    "invoice_for_tenant",
    "invoice_lines",
    "invoices_for_tenant",
    "role_for_user",
    "spend_per_hour",
    "tenant_for_user",
    "tenants_for_user",
    "tenants_visible_to",
    "top_requests_by_priority",
]
