"""The accounts app's models, one module per concern."""

from accounts.models.autobidder import Autobidder, AutobidderStep, AutobidPeriod
from accounts.models.budgets import Budget, BudgetCounter, Hold, HoldState, Period
from accounts.models.invoices import Invoice, InvoiceLine
from accounts.models.keys import ApiKey
from accounts.models.ledger import (
    BidSource,
    ChargeKind,
    LedgerEntry,
    PriorityDetail,
    Request,
    RequestStatus,
)
from accounts.models.tenants import Membership, Role, Tenant

__all__ = [
    "ApiKey",
    "AutobidPeriod",
    "Autobidder",
    "AutobidderStep",
    "BidSource",
    "Budget",
    "BudgetCounter",
    "ChargeKind",
    "Hold",
    "HoldState",
    "Invoice",
    "InvoiceLine",
    "LedgerEntry",
    "Membership",
    "Period",
    "PriorityDetail",
    "Request",
    "RequestStatus",
    "Role",
    "Tenant",
]
