"""Reads about budgets: how much of each budget is spent, held and left, right now.

Spend is the sum of the ledger entries created in the budget's current window (computed from the
clock, ``accounts.windows``); held is the sum of the open holds, whatever their window (a request
in flight still reserves its money when a new window starts).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import F, Q, Sum
from django.utils import timezone

from accounts.models import ApiKey, Budget, Hold, HoldState, LedgerEntry, Tenant
from accounts.money import ZERO, money_str
from accounts.windows import window_for


@dataclass(frozen=True)
class BudgetStatus:
    """One budget at one moment. Amounts in dollars, times in UTC, seconds for durations."""

    budget_id: int
    scope: str  # "tenant" or "key"
    period: str
    limit: Decimal
    spent: Decimal  # ledger entries in the current window
    held: Decimal  # open holds (requests in flight)
    remaining: Decimal  # limit - spent - held, never below 0
    window_start: datetime
    resets_at: datetime | None  # None: the budget never resets
    seconds_until_reset: float | None
    soft_alert: bool  # spent has reached the soft alert fraction of the limit

    def fits(self, amount: Decimal) -> bool:
        """Whether ``amount`` more can be held: spent + held + amount <= limit."""
        return self.spent + self.held + amount <= self.limit

    def as_json(self) -> dict[str, object]:
        """JSON-ready: exact amounts as strings, times as ISO 8601."""
        return {
            "budget_id": self.budget_id,
            "scope": self.scope,
            "period": self.period,
            "limit": money_str(self.limit),
            "spent": money_str(self.spent),
            "held": money_str(self.held),
            "remaining": money_str(self.remaining),
            "window_start": self.window_start.isoformat(),
            "resets_at": self.resets_at.isoformat() if self.resets_at else None,
            "seconds_until_reset": self.seconds_until_reset,
            "soft_alert": self.soft_alert,
        }


def budget_usage(*, budget: Budget, now: datetime | None = None) -> BudgetStatus:
    """The status of ``budget`` at ``now`` (default: the clock).

    Writers (holds, settlement, releases) lock the budget rows first, so read under the same
    lock this is a consistent picture on PostgreSQL.
    """
    now = now or timezone.now()
    window = window_for(period=budget.period, now=now)
    entries = LedgerEntry.objects.filter(tenant_id=budget.tenant_id, created_at__gte=window.start)
    if window.end is not None:
        entries = entries.filter(created_at__lt=window.end)
    holds = Hold.objects.filter(tenant_id=budget.tenant_id, state=HoldState.OPEN)
    if budget.api_key_id is not None:
        entries = entries.filter(api_key_id=budget.api_key_id)
        holds = holds.filter(api_key_id=budget.api_key_id)
    spent = entries.aggregate(total=Sum("amount"))["total"] or ZERO
    held = holds.aggregate(total=Sum("remaining"))["total"] or ZERO
    remaining = max(budget.limit - spent - held, ZERO)
    return BudgetStatus(
        budget_id=budget.pk,
        scope="key" if budget.api_key_id is not None else "tenant",
        period=budget.period,
        limit=budget.limit,
        spent=spent,
        held=held,
        remaining=remaining,
        window_start=window.start,
        resets_at=window.end,
        seconds_until_reset=window.seconds_until_end(now),
        soft_alert=spent >= budget.soft_alert_fraction * budget.limit,
    )


def budgets_applying(*, tenant: Tenant, api_key: ApiKey | None = None) -> list[Budget]:
    """The budgets a request of ``tenant`` with ``api_key`` must fit: the tenant's, the key's."""
    condition = Q(tenant=tenant, api_key__isnull=True)
    if api_key is not None:
        condition |= Q(tenant=tenant, api_key=api_key)
    return list(Budget.objects.filter(condition).order_by("id"))


def budget_status(
    *, tenant: Tenant, api_key: ApiKey | None = None, now: datetime | None = None
) -> BudgetStatus | None:
    """The binding budget of ``tenant`` (and ``api_key``): the one with the least remaining.

    None when no budget applies (the tenant has none and neither does the key).
    """
    now = now or timezone.now()
    statuses = [
        budget_usage(budget=b, now=now) for b in budgets_applying(tenant=tenant, api_key=api_key)
    ]
    if not statuses:
        return None
    # min() keeps the first of equals: the tenant's budget sorts first when created first.
    return min(statuses, key=lambda s: s.remaining)


def budget_statuses_for_tenant(
    *, tenant: Tenant, now: datetime | None = None
) -> list[BudgetStatus]:
    """Every budget of ``tenant`` (its own, then its keys'), with its status at ``now``."""
    now = now or timezone.now()
    budgets = Budget.objects.filter(tenant=tenant).order_by(
        F("api_key_id").asc(nulls_first=True), "id"
    )
    return [budget_usage(budget=b, now=now) for b in budgets]
