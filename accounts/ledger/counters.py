"""The budget counter rows (``accounts.models.BudgetCounter``) a write needs and that do not
exist yet (the first request of a tenant or key): summed from the ledger and the open holds."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Max, Q, Sum

from accounts.models import BudgetCounter, Hold, HoldState, LedgerEntry
from accounts.models.budgets import WINDOWED_PERIODS
from accounts.money import ZERO
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
    from the ledger (:func:`budget_counter_rebuilt`): ``INSERT ... ON CONFLICT DO NOTHING``, so a
    row created meanwhile by another writer is kept, and counts from then on.

    In a transaction, call it before the transaction's own writes (which the sums would count
    twice); a row it creates stays locked until the transaction ends.
    """
    found = set(
        BudgetCounter.objects.filter(
            Q(api_key__isnull=True) | Q(api_key_id=api_key_id), tenant_id=tenant_id
        ).values_list("api_key_id", flat=True)
    )
    scopes = [None] if api_key_id is None else [None, api_key_id]  # the order rows are locked in
    missing = [scope for scope in scopes if scope not in found]
    BudgetCounter.objects.bulk_create(
        [
            BudgetCounter(
                tenant_id=tenant_id,
                api_key_id=scope,
                **budget_counter_rebuilt(tenant_id=tenant_id, api_key_id=scope, now=now),
            )
            for scope in missing
        ],
        ignore_conflicts=True,
    )
