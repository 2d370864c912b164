"""Reads of the accounts app, one module per concern; the public ones are re-exported here."""

from accounts.selectors.billing import (
    api_key_for_tenant,
    api_keys_for_tenant,
    invoice_breakdown,
    invoice_for_tenant,
    invoices_for_tenant,
)
from accounts.selectors.budgets import (
    budget_status,
    budget_statuses_for_key,
    budget_statuses_for_tenant,
    tenant_month_spend,
)
from accounts.selectors.dashboards import (
    charges_by_market,
    spend_per_hour,
    top_requests_by_priority,
)
from accounts.selectors.tenants import (
    can_manage_keys,
    role_for_user,
    tenant_for_user,
    tenants_for_user,
)

__all__ = [
    "api_key_for_tenant",
    "api_keys_for_tenant",
    "budget_status",
    "budget_statuses_for_key",
    "budget_statuses_for_tenant",
    "can_manage_keys",
    "charges_by_market",
    "invoice_breakdown",
    "invoice_for_tenant",
    "invoices_for_tenant",
    "role_for_user",
    "spend_per_hour",
    "tenant_month_spend",
    "tenant_for_user",
    "tenants_for_user",
    "top_requests_by_priority",
]
