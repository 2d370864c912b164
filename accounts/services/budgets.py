"""Budgets, holds and the counters they are checked against (docs/ledger.md, "Budgets and holds"
and "The money rules"; the autobidder's budget: docs/mechanism.md, "The autobidder").

The gateway holds a request's worst-case cost before forwarding it (:func:`budget_hold`); the
settlement turns the hold into ledger entries; a failed request's hold is released
(:func:`hold_release`). Every write that changes what a tenant or key has spent or holds updates
its :class:`~accounts.models.BudgetCounter` rows in the same transaction, with the rows locked
(``SELECT ... FOR UPDATE``, the tenant's row before the key's, and always after the request's and
the hold's rows, so two writers never deadlock): concurrent holds are serialized per tenant and
cannot overspend.

The writes themselves are the ledger store's (``accounts.ledger``: one PostgreSQL statement
each).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.utils import timezone

from accounts.ledger import ledger_store
from accounts.models import ApiKey, Budget, Hold, Period, Tenant
from accounts.money import money, money_exact


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
    amount = hold_amount_checked(tenant=tenant, api_key=api_key, amount=amount)
    return ledger_store().hold_place(
        tenant=tenant,
        api_key=api_key,
        request_id=request_id,
        amount=amount,
        now=now or timezone.now(),
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


def hold_release(*, request_id: str, now: datetime | None = None) -> bool:
    """Release the open hold of a request that failed (503, client gone): no charge for it.

    Returns whether a hold was released (False when there is none or it is already closed).
    Charges already settled for the request are kept.
    """
    return ledger_store().hold_close(
        request_id=request_id, now=now or timezone.now(), fail_request=False
    )
