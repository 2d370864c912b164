"""The budget counter rows (``accounts.models.BudgetCounter``) as the reference ledger code
keeps them: created when first needed (summed from the ledger), locked in one order, saved, and
read for what every budget that applies has left."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import F, Max, Q, Sum

from accounts.models import Budget, BudgetCounter, Hold, HoldState, LedgerEntry
from accounts.models.budgets import WINDOWED_PERIODS
from accounts.money import ZERO
from accounts.rules import VALUES, left
from accounts.windows import window_for


def budget_counter_rebuilt(
    *, tenant_id: int, api_key_id: int | None, now: datetime
) -> dict[str, object]:
    """The counter values of a tenant (``api_key_id`` None) or a key, summed from the ledger and
    the open holds; each period's window is the one of ``now`` or of the latest entry, whichever
    is later."""
    entries = LedgerEntry.objects.filter(tenant_id=tenant_id)
    holds = Hold.objects.filter(tenant_id=tenant_id, state=HoldState.OPEN)
    if api_key_id is not None:
        entries = entries.filter(api_key_id=api_key_id)
        holds = holds.filter(api_key_id=api_key_id)
    totals = entries.aggregate(total=Sum("amount"), latest=Max("created_at"))
    at = max(now, totals["latest"] or now)
    values: dict[str, object] = {
        "held": holds.aggregate(total=Sum("remaining"))["total"] or ZERO,
        "spent_total": totals["total"] or ZERO,
    }
    sums = {}
    for period in WINDOWED_PERIODS:
        window = window_for(period=period, now=at)
        values[f"{period}_start"] = window.start
        sums[f"{period}_spent"] = Sum(
            "amount", filter=Q(created_at__gte=window.start, created_at__lt=window.end)
        )
    values.update({name: total or ZERO for name, total in entries.aggregate(**sums).items()})
    return values


def budget_counters_ensure(*, tenant_id: int, api_key_id: int | None, now: datetime) -> None:
    """Create the counter rows of a tenant and of its key (if any) that do not exist yet, summed
    from the ledger (:func:`budget_counter_rebuilt`).

    Call first in a transaction, before its own writes (which the sums would count twice) and
    before it locks anything (a new row is locked until the transaction commits).
    """
    scopes = [None] if api_key_id is None else [None, api_key_id]
    found = set(
        BudgetCounter.objects.filter(
            Q(api_key__isnull=True) | Q(api_key_id=api_key_id), tenant_id=tenant_id
        ).values_list("api_key_id", flat=True)
    )
    for scope in scopes:
        if scope in found:
            continue
        values = budget_counter_rebuilt(tenant_id=tenant_id, api_key_id=scope, now=now)
        try:
            with transaction.atomic():
                BudgetCounter.objects.create(tenant_id=tenant_id, api_key_id=scope, **values)
        except IntegrityError:
            pass  # created concurrently: that row counts from then on


def budget_counters_locked(*, tenant_id: int, api_key_id: int | None) -> list[BudgetCounter]:
    """Lock and return the counter rows of a tenant and of its key (if any), the tenant's first
    (:func:`budget_counters_ensure` them first). Call inside ``transaction.atomic``."""
    return list(
        BudgetCounter.objects.select_for_update()
        .filter(Q(api_key__isnull=True) | Q(api_key_id=api_key_id), tenant_id=tenant_id)
        .order_by(F("api_key_id").asc(nulls_first=True))
    )


def budget_counters_saved(counters: list[BudgetCounter]) -> None:
    """Save what changed in locked counter rows."""
    for counter in counters:
        counter.save(
            update_fields=[
                "held", "spent_total", "day_start", "day_spent", "week_start", "week_spent",
                "month_start", "month_spent",
            ]
        )  # fmt: skip


def budget_room(
    *, tenant_id: int, api_key_id: int | None, counters: list[BudgetCounter], now: datetime
) -> Decimal | None:
    """The least, over the budgets that apply to a request of (tenant, key), of limit - spent
    in the window at ``now`` - held, dollars, from their ``counters`` (locked by the caller);
    None when no budget applies. A window newer than ``now``'s (the caller's clock is behind
    the row's) reads the row's window: the most it can have spent."""
    by_scope = {c.api_key_id: c for c in counters}
    budgets = Budget.objects.filter(
        Q(api_key__isnull=True) | Q(api_key_id=api_key_id), tenant_id=tenant_id
    )
    rooms = []
    for budget in budgets:
        counter = by_scope[budget.api_key_id]
        start = window_for(period=budget.period, now=now).start
        spent = counter.spent_in(period=budget.period, window_start=start, at_most=True)
        rooms.append(left(VALUES, limit=budget.limit, spent=spent, held=counter.held))
    return min(rooms, default=None)
