"""Budgets, holds and the counters they are checked against (DESIGN.md 4.6 and 6).

The gateway holds a request's worst-case cost before forwarding it (:func:`budget_hold`); the
settlement turns the hold into ledger entries; a failed request's hold is released
(:func:`hold_release`). Every write that changes what a tenant or key has spent or holds updates
its :class:`~accounts.models.BudgetCounter` rows in the same transaction, with the rows locked
(``SELECT ... FOR UPDATE``, the tenant's row before the key's, and always after the request's and
the hold's rows, so two writers never deadlock): on PostgreSQL concurrent holds are serialized
per tenant and cannot overspend.

On PostgreSQL each of these writes is one statement (``accounts.services.fastpath``); the ORM
code here is the reference, and runs on other databases and whenever a statement declines.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.db import IntegrityError, transaction
from django.db.models import F, Max, Q, Sum
from django.utils import timezone

from accounts.models import (
    ApiKey,
    Budget,
    BudgetCounter,
    Hold,
    HoldState,
    LedgerEntry,
    Period,
    Tenant,
)
from accounts.models.budgets import WINDOWED_PERIODS
from accounts.money import ZERO, money, money_exact, money_str
from accounts.selectors.budgets import BudgetStatus, budget_status_of, budget_usage_counted
from accounts.services import fastpath
from accounts.windows import window_for


class BudgetExhausted(Exception):
    """A request does not fit a budget. Carries what the gateway's 402 answer needs."""

    def __init__(self, *, status: BudgetStatus, amount: Decimal) -> None:
        self.status = status
        self.amount = amount
        self.scope = status.scope
        self.remaining = status.remaining
        self.resets_at = status.resets_at
        self.seconds_until_reset = status.seconds_until_reset
        when = (
            "never resets"
            if status.seconds_until_reset is None
            else f"resets in {status.seconds_until_reset:.0f} s ({status.resets_at.isoformat()})"
        )
        super().__init__(
            f"{status.scope} budget exhausted: ${money_str(amount)} needed, "
            f"${money_str(status.remaining)} left of ${money_str(status.limit)} per "
            f"{status.period}; {when}"
        )


def budget_set(
    *,
    tenant: Tenant,
    limit: Decimal | str | int,
    period: str = Period.MONTH,
    api_key: ApiKey | None = None,
    soft_alert_fraction: Decimal | str = "0.8",
) -> Budget:
    """Create or change the budget of ``tenant`` (or of its ``api_key``): ``limit`` dollars per
    ``period``. The window is read from the clock, so a change applies to the current window's
    spend as it stands: nothing is reset, nothing is re-anchored to the moment of the change."""
    if period not in Period.values:
        raise ValueError(f"unknown budget period {period!r}")
    if api_key is not None and api_key.tenant_id != tenant.pk:
        raise ValueError("the API key belongs to another tenant")
    try:
        fraction = Decimal(str(soft_alert_fraction))
    except InvalidOperation as exc:
        raise ValueError(f"not a fraction: {soft_alert_fraction!r}") from exc
    if not fraction.is_finite() or not 0 <= fraction <= 1 or fraction.as_tuple().exponent < -4:
        raise ValueError(
            f"soft alert fraction must be between 0 and 1, 4 places at most: "
            f"{soft_alert_fraction!r}"
        )
    values = {"period": period, "limit": money_exact(limit), "soft_alert_fraction": fraction}
    with transaction.atomic():
        budget, _ = Budget.objects.update_or_create(tenant=tenant, api_key=api_key, defaults=values)
    return budget


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


def budget_hold(
    *,
    tenant: Tenant,
    api_key: ApiKey | None,
    request_id: str,
    amount: Decimal | float | str | int,
    now: datetime | None = None,
) -> Hold:
    """Reserve ``amount`` dollars for request ``request_id`` against every budget that applies.

    Raises :class:`BudgetExhausted` unless spent_in_window + held + amount <= limit for the
    tenant's budget and the key's (if they have one); nothing is written then. Idempotent: a
    second call for the same request returns the first hold unchanged.
    """
    amount = hold_amount_checked(tenant=tenant, api_key=api_key, amount=amount)
    now = now or timezone.now()
    if fastpath.available():
        placed = hold_fast(
            tenant=tenant, api_key=api_key, request_id=request_id, amount=amount, now=now
        )
        if placed is not None:
            return fastpath.model_loaded(
                Hold,
                {
                    "id": placed.hold_id,
                    "request_id": request_id,
                    "tenant_id": tenant.pk,
                    "api_key_id": api_key.pk if api_key else None,
                    "amount": amount,
                    "remaining": amount,
                    "state": HoldState.OPEN,
                    "created_at": now,
                    "closed_at": None,
                },
            )
    with transaction.atomic():
        return hold_reference(
            tenant=tenant, api_key=api_key, request_id=request_id, amount=amount, now=now
        )


def hold_amount_checked(
    *, tenant: Tenant, api_key: ApiKey | None, amount: Decimal | float | str | int
) -> Decimal:
    """The hold's amount in dollars (:func:`accounts.money.money`), once the key is known to
    be the tenant's and active (ValueError otherwise)."""
    if api_key is not None and api_key.tenant_id != tenant.pk:
        raise ValueError("the API key belongs to another tenant")
    if api_key is not None and api_key.revoked_at is not None:
        raise ValueError("the API key is revoked")
    return money(amount)


def hold_fast(
    *,
    tenant: Tenant,
    api_key: ApiKey | None,
    request_id: str,
    amount: Decimal,
    now: datetime,
    request: dict[str, object] | None = None,
) -> fastpath.HoldOutcome | None:
    """The hold statement (PostgreSQL), with the request's row when ``request`` is given: what
    it did when it placed the hold, BudgetExhausted when a budget refused it, else None: the
    reference code decides (the statement declined, or the request already has a hold)."""
    api_key_id = api_key.pk if api_key else None
    fast = fastpath.hold_place(
        tenant_id=tenant.pk,
        api_key_id=api_key_id,
        request_id=request_id,
        amount=amount,
        now=now,
        request=request,
    )
    if fast.hold_id is not None:
        return fast
    if not fast.counted or fast.fits:
        return None  # declined, or a hold is already there
    if Hold.objects.filter(request_id=request_id).exists():
        return None  # a replay: the first hold is returned, whatever the budget says now
    raise BudgetExhausted(status=_refusal(fast.budgets, amount=amount, now=now), amount=amount)


def _refusal(rows: list[fastpath.BudgetRow], *, amount: Decimal, now: datetime) -> BudgetStatus:
    """The status of the first budget, in id order, that the hold statement found too full."""
    row = next(r for r in rows if r.spent + r.held + amount > r.limit)
    budget = Budget(
        id=row.budget_id,
        api_key_id=row.api_key_id,
        period=row.period,
        limit=row.limit,
        soft_alert_fraction=row.soft_alert_fraction,
    )
    window = window_for(period=row.period, now=now)
    return budget_status_of(budget=budget, spent=row.spent, held=row.held, window=window, now=now)


def hold_reference(
    *, tenant: Tenant, api_key: ApiKey | None, request_id: str, amount: Decimal, now: datetime
) -> Hold:
    """:func:`budget_hold`'s writes with the ORM. Call inside ``transaction.atomic``, first."""
    api_key_id = api_key.pk if api_key else None
    budget_counters_ensure(tenant_id=tenant.pk, api_key_id=api_key_id, now=now)
    counters = budget_counters_locked(tenant_id=tenant.pk, api_key_id=api_key_id)
    existing = Hold.objects.filter(request_id=request_id).first()
    if existing is not None:
        return _same_owner(existing, tenant=tenant, api_key=api_key)
    by_scope = {c.api_key_id: c for c in counters}
    budgets = Budget.objects.filter(
        Q(api_key__isnull=True) | Q(api_key_id=api_key_id), tenant=tenant
    ).order_by("id")
    for budget in budgets:
        status = budget_usage_counted(budget=budget, counter=by_scope[budget.api_key_id], now=now)
        if not status.fits(amount):
            raise BudgetExhausted(status=status, amount=amount)
    hold = Hold.objects.create(
        request_id=request_id,
        tenant=tenant,
        api_key=api_key,
        amount=amount,
        remaining=amount,
        created_at=now,
    )
    for counter in counters:
        counter.held += amount
    budget_counters_saved(counters)
    return hold


def _same_owner(hold: Hold, *, tenant: Tenant, api_key: ApiKey | None) -> Hold:
    if hold.tenant_id != tenant.pk or hold.api_key_id != (api_key.pk if api_key else None):
        raise ValueError(f"request {hold.request_id!r} is held for another tenant or key")
    return hold


def budget_room(
    *, tenant_id: int, api_key_id: int | None, counters: list[BudgetCounter], now: datetime
) -> Decimal | None:
    """The least, over the budgets that apply to a request of (tenant, key), of limit - spent
    in the window at ``now`` - held, dollars, from their ``counters`` (locked by the caller);
    None when no budget applies. A window newer than ``now``'s (the caller's clock is behind
    the row's) reads the row's window: the most it can have spent."""
    by_scope = {c.api_key_id: c for c in counters}
    rooms = []
    budgets = Budget.objects.filter(
        Q(api_key__isnull=True) | Q(api_key_id=api_key_id), tenant_id=tenant_id
    )
    for budget in budgets:
        counter = by_scope[budget.api_key_id]
        start = window_for(period=budget.period, now=now).start
        spent = counter.spent_in(period=budget.period, window_start=start)
        if spent is None:
            spent = getattr(counter, f"{budget.period}_spent")
        rooms.append(budget.limit - spent - counter.held)
    return min(rooms, default=None)


def hold_release(*, request_id: str, now: datetime | None = None) -> bool:
    """Release the open hold of a request that failed (503, client gone): no charge for it.

    Returns whether a hold was released (False when there is none or it is already closed).
    Charges already settled for the request are kept.
    """
    now = now or timezone.now()
    if fastpath.available():
        fast = fastpath.hold_close(request_id=request_id, now=now, fail_request=False)
        if fast.counted:
            return fast.released
    hold = Hold.objects.filter(request_id=request_id).first()
    if hold is None:
        return False
    with transaction.atomic():
        budget_counters_ensure(tenant_id=hold.tenant_id, api_key_id=hold.api_key_id, now=now)
        return hold_released(request_id=request_id, now=now)


def hold_released(*, request_id: str, now: datetime) -> bool:
    """:func:`hold_release`'s writes with the ORM: call inside ``transaction.atomic``, with the
    hold's counter rows ensured and the request (if any) locked."""
    hold = Hold.objects.select_for_update().filter(request_id=request_id).first()
    if hold is None or hold.state != HoldState.OPEN:
        return False
    counters = budget_counters_locked(tenant_id=hold.tenant_id, api_key_id=hold.api_key_id)
    for counter in counters:
        counter.held -= hold.remaining
    budget_counters_saved(counters)
    hold.state, hold.remaining, hold.closed_at = HoldState.RELEASED, ZERO, now
    hold.save(update_fields=["remaining", "state", "closed_at"])
    return True
