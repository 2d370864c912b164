"""Reads about budgets: how much of each budget is spent, held and left, right now.

Spend is what the ledger entries created in the budget's current window (computed from the clock,
``accounts.windows``) add up to; held is the sum of the open holds, whatever their window (a
request in flight still reserves its money when a new window starts). Both are read from the
budget's :class:`~accounts.models.BudgetCounter` row, one row whatever the history; only a window
older than the one the row keeps is summed from the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import F, Q, Sum
from django.utils import timezone

from accounts import rules
from accounts.algebra import VALUES
from accounts.models import ApiKey, Budget, BudgetCounter, Hold, HoldState, LedgerEntry, Tenant
from accounts.money import ZERO, money_str
from accounts.windows import Window, window_for


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
        """Whether ``amount`` more can be held (``rules.fits``)."""

        return rules.fits(VALUES, limit=self.limit, spent=self.spent, held=self.held, amount=amount)

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


def budget_status_of(
    *, budget: Budget, spent: Decimal, held: Decimal, window: Window, now: datetime
) -> BudgetStatus:
    """The status of ``budget`` given what was spent in ``window`` (its window at ``now``) and
    what is held, in dollars."""
    return BudgetStatus(
        budget_id=budget.pk,
        scope="key" if budget.api_key_id is not None else "tenant",
        period=budget.period,
        limit=budget.limit,
        spent=spent,
        held=held,
        remaining=max(rules.left(VALUES, limit=budget.limit, spent=spent, held=held), ZERO),
        window_start=window.start,
        resets_at=window.end,
        seconds_until_reset=window.seconds_until_end(now),
        soft_alert=spent >= budget.soft_alert_fraction * budget.limit,
    )


def budget_counter_for(*, tenant_id: int, api_key_id: int | None) -> BudgetCounter | None:
    """The counters of a tenant (``api_key_id`` None: all of its requests) or of one key."""
    return BudgetCounter.objects.filter(tenant_id=tenant_id, api_key_id=api_key_id).first()


def ledger_spent(*, tenant_id: int, api_key_id: int | None, window: Window) -> Decimal:
    """Dollars of the ledger entries of a tenant (or one key) created in ``window``, summed."""
    entries = LedgerEntry.objects.filter(tenant_id=tenant_id, created_at__gte=window.start)
    if window.end is not None:
        entries = entries.filter(created_at__lt=window.end)
    if api_key_id is not None:
        entries = entries.filter(api_key_id=api_key_id)
    return entries.aggregate(total=Sum("amount"))["total"] or ZERO


@dataclass(frozen=True)
class WindowSpend:
    """What a tenant (or one of its keys) spent in one window, and holds now, in dollars."""

    window: Window
    spent: Decimal  # ledger entries in ``window``
    held: Decimal  # open holds, whatever their window


def window_spend_counted(
    *,
    tenant_id: int,
    api_key_id: int | None,
    period: str,
    counter: BudgetCounter | None,
    now: datetime,
) -> WindowSpend:
    """The spend of a tenant (``api_key_id`` None: all of its requests) or one key in the window
    of ``period`` at ``now``, and its held, from its counter row (read with it, or locked by the
    caller); the ledger and the holds are summed only for what the row cannot tell: a window
    older than the row's, or no row at all (no request since the counters exist)."""
    window = window_for(period=period, now=now)
    spent = counter.spent_in(period=period, window_start=window.start) if counter else None
    if spent is None:
        spent = ledger_spent(tenant_id=tenant_id, api_key_id=api_key_id, window=window)
    if counter is not None:
        held = counter.held
    else:
        holds = Hold.objects.filter(tenant_id=tenant_id, state=HoldState.OPEN)
        if api_key_id is not None:
            holds = holds.filter(api_key_id=api_key_id)
        held = holds.aggregate(total=Sum("remaining"))["total"] or ZERO
    return WindowSpend(window=window, spent=spent, held=held)


def budget_usage_counted(
    *, budget: Budget, counter: BudgetCounter | None, now: datetime
) -> BudgetStatus:
    """The status of ``budget`` at ``now`` from its counter row (read with it, or locked by
    the caller; :func:`window_spend_counted`)."""
    usage = window_spend_counted(
        tenant_id=budget.tenant_id,
        api_key_id=budget.api_key_id,
        period=budget.period,
        counter=counter,
        now=now,
    )
    return budget_status_of(
        budget=budget, spent=usage.spent, held=usage.held, window=usage.window, now=now
    )


def tenant_month_spend(*, tenant: Tenant, now: datetime | None = None) -> WindowSpend:
    """What ``tenant`` spent this UTC calendar month and what its requests in flight hold,
    whether or not it has a budget (its counter row, as its budgets read it)."""
    now = now or timezone.now()
    return window_spend_counted(
        tenant_id=tenant.pk,
        api_key_id=None,
        period="month",
        counter=budget_counter_for(tenant_id=tenant.pk, api_key_id=None),
        now=now,
    )


def budget_usage(*, budget: Budget, now: datetime | None = None) -> BudgetStatus:
    """The status of ``budget`` at ``now`` (default: the clock)."""
    now = now or timezone.now()
    counter = budget_counter_for(tenant_id=budget.tenant_id, api_key_id=budget.api_key_id)
    return budget_usage_counted(budget=budget, counter=counter, now=now)


def _usages(budgets: list[Budget], now: datetime) -> list[BudgetStatus]:
    """The status of each of ``budgets`` (all of one tenant), their counters read at once."""
    if not budgets:
        return []
    tenant_id = budgets[0].tenant_id
    key_ids = [b.api_key_id for b in budgets if b.api_key_id is not None]
    counters = {
        c.api_key_id: c
        for c in BudgetCounter.objects.filter(
            Q(api_key__isnull=True) | Q(api_key_id__in=key_ids), tenant_id=tenant_id
        )
    }
    return [
        budget_usage_counted(budget=b, counter=counters.get(b.api_key_id), now=now) for b in budgets
    ]


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
    statuses = _usages(budgets_applying(tenant=tenant, api_key=api_key), now)
    if not statuses:
        return None
    # min() keeps the first of equals: the tenant's budget sorts first when created first.
    return min(statuses, key=lambda s: s.remaining)


def budget_statuses_for_key(*, api_key: ApiKey, now: datetime | None = None) -> list[BudgetStatus]:
    """The budgets a request with ``api_key`` must fit, each with its status at ``now``: its
    tenant's, then its own (never another key's, nor another tenant's)."""
    now = now or timezone.now()
    statuses = _usages(budgets_applying(tenant=api_key.tenant, api_key=api_key), now)
    return sorted(statuses, key=lambda s: s.scope != "tenant")  # stable: the tenant's first


def budget_statuses_for_tenant(
    *, tenant: Tenant, now: datetime | None = None
) -> list[BudgetStatus]:
    """Every budget of ``tenant`` (its own, then its keys'), with its status at ``now``."""
    now = now or timezone.now()
    budgets = Budget.objects.filter(tenant=tenant).order_by(
        F("api_key_id").asc(nulls_first=True), "id"
    )
    return _usages(list(budgets), now)
