"""Budgets, holds and their locks (DESIGN.md 4.6 and 6).

The gateway holds a request's worst-case cost before forwarding it (:func:`budget_hold`); the
settlement turns the hold into ledger entries; a failed request's hold is released
(:func:`hold_release`). Every write that changes what a budget has spent or holds first locks
the budget rows that apply (``SELECT ... FOR UPDATE``, in id order so two writers never
deadlock), then reads the current window's spend and the open holds: on PostgreSQL concurrent
holds are serialized per budget and cannot overspend it.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from accounts.models import ApiKey, Budget, Hold, HoldState, Period, Tenant
from accounts.money import money, money_exact
from accounts.selectors.budgets import BudgetStatus, budget_usage


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
            f"{status.scope} budget exhausted: ${amount} needed, ${status.remaining} left of "
            f"${status.limit} per {status.period}; {when}"
        )


def budgets_locked(*, tenant_id: int, api_key_id: int | None) -> list[Budget]:
    """Lock and return the budgets a request of this tenant and key must fit, in id order.

    Call inside ``transaction.atomic``; the locks are held until it commits.
    """
    condition = Q(tenant_id=tenant_id, api_key__isnull=True)
    if api_key_id is not None:
        condition |= Q(tenant_id=tenant_id, api_key_id=api_key_id)
    return list(Budget.objects.select_for_update().filter(condition).order_by("id"))


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
    if api_key is not None and api_key.tenant_id != tenant.pk:
        raise ValueError("the API key belongs to another tenant")
    if api_key is not None and api_key.revoked_at is not None:
        raise ValueError("the API key is revoked")
    amount = money(amount)
    now = now or timezone.now()
    with transaction.atomic():
        budgets = budgets_locked(tenant_id=tenant.pk, api_key_id=api_key.pk if api_key else None)
        existing = Hold.objects.filter(request_id=request_id).first()
        if existing is not None:
            return _same_owner(existing, tenant=tenant, api_key=api_key)
        for budget in budgets:
            status = budget_usage(budget=budget, now=now)
            if not status.fits(amount):
                raise BudgetExhausted(status=status, amount=amount)
        try:
            with transaction.atomic():
                return Hold.objects.create(
                    request_id=request_id,
                    tenant=tenant,
                    api_key=api_key,
                    amount=amount,
                    remaining=amount,
                    created_at=now,
                )
        except IntegrityError:
            # Placed concurrently for the same request (possible when no budget row was locked).
            return _same_owner(
                Hold.objects.get(request_id=request_id), tenant=tenant, api_key=api_key
            )


def _same_owner(hold: Hold, *, tenant: Tenant, api_key: ApiKey | None) -> Hold:
    if hold.tenant_id != tenant.pk or hold.api_key_id != (api_key.pk if api_key else None):
        raise ValueError(f"request {hold.request_id!r} is held for another tenant or key")
    return hold


def hold_consume(*, request_id: str, amount: Decimal, close: bool, now: datetime) -> None:
    """Lower the open hold of ``request_id`` by a settled charge of ``amount`` dollars (not
    below 0), and close it as settled when ``close``. Call with the budgets locked."""
    hold = Hold.objects.select_for_update().filter(request_id=request_id).first()
    if hold is None or hold.state != HoldState.OPEN:
        return
    hold.remaining = max(hold.remaining - amount, Decimal(0))
    if close:
        hold.state, hold.remaining, hold.closed_at = HoldState.SETTLED, Decimal(0), now
    hold.save(update_fields=["remaining", "state", "closed_at"])


def hold_release(*, request_id: str, now: datetime | None = None) -> bool:
    """Release the open hold of a request that failed (503, client gone): no charge for it.

    Returns whether a hold was released (False when there is none or it is already closed).
    Charges already settled for the request are kept.
    """
    now = now or timezone.now()
    hold = Hold.objects.filter(request_id=request_id).first()
    if hold is None:
        return False
    with transaction.atomic():
        budgets_locked(tenant_id=hold.tenant_id, api_key_id=hold.api_key_id)
        released = Hold.objects.filter(pk=hold.pk, state=HoldState.OPEN).update(
            state=HoldState.RELEASED, remaining=0, closed_at=now
        )
    return released == 1
