"""The autobidder's writes: its settings, the bid it makes for a request, its pacing steps.

The state between calls is the multiplier ``mu`` on the tenant's :class:`Autobidder` row; the
budget window and what was spent in it are read from the clock and the ledger each time, so,
as for budgets, nothing resets by a job. Bids are quantized to whole nano-dollars per second
with the money rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_FLOOR, Decimal

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from accounts.models import (
    Autobidder,
    AutobidderStep,
    AutobidPeriod,
    BidSource,
    ChargeKind,
    LedgerEntry,
    Tenant,
)
from accounts.money import QUANTUM as TICK
from accounts.money import ZERO, money, money_exact
from accounts.windows import window_for
from market.mechanism.pacing import PacingAgent


@dataclass(frozen=True)
class AutoBid:
    """The autobidder's bid for one request, and the hold it implies."""

    bid: Decimal  # dollars per second of waiting
    max_wait_s: float  # the planned-wait bound the bid was capped for
    mu: float

    @property
    def worst_case(self) -> Decimal:
        """The most its priority charge can be (bid x planned wait bound), dollars."""
        return money(self.bid * Decimal(repr(self.max_wait_s)))


def autobidder_configure(
    *,
    tenant: Tenant,
    enabled: bool,
    budget: Decimal | str,
    period: str = AutobidPeriod.DAY,
    values: dict[str, Decimal | str],
    max_wait_s: float = 60.0,
    eta: float = 0.5,
    mu_max: float = 20.0,
) -> Autobidder:
    """Create or change a tenant's autobidder; ValueError naming the bad setting.

    Changing settings keeps the multiplier (clipped to the new ``mu_max``): a change mid-window
    does not start the pacing over.
    """
    if period not in AutobidPeriod.values:
        raise ValueError(f"unknown autobidder period {period!r}")
    budget = money_exact(budget)
    clean = {}
    for name, value in values.items():
        if not isinstance(name, str) or not name or len(name) > 50:
            raise ValueError(f"bad request class name {name!r}")
        clean[name] = str(money_exact(value))
    if enabled and not clean:
        raise ValueError("an enabled autobidder needs a value for at least one request class")
    for label, number, low in (
        ("max_wait_s", max_wait_s, 0.0),
        ("eta", eta, 0.0),
        ("mu_max", mu_max, 0.0),
    ):
        if not isinstance(number, int | float) or not math.isfinite(number) or number <= low:
            raise ValueError(f"{label} must be a finite number > {low}, got {number!r}")
    with transaction.atomic():
        auto, created = Autobidder.objects.select_for_update().get_or_create(tenant=tenant)
        if created or auto.period != period:
            # The counter settlement checks priority charges against, for the new window.
            now = timezone.now()
            auto.spent_start = window_for(period=period, now=now).start
            auto.spent_in_window = _spent(
                tenant_id=tenant.pk, start=auto.spent_start, end=now + timedelta(days=1)
            )
        auto.enabled = enabled
        auto.budget = budget
        auto.period = period
        auto.values = clean
        auto.max_wait_s = float(max_wait_s)
        auto.eta = float(eta)
        auto.mu_max = float(mu_max)
        auto.mu = min(auto.mu, auto.mu_max)
        auto.save()
    return auto


def _spent(*, tenant_id: int, start: datetime, end: datetime) -> Decimal:
    """Priority dollars charged in [start, end) to the tenant's autobid requests."""
    total = LedgerEntry.objects.filter(
        tenant_id=tenant_id,
        kind=ChargeKind.PRIORITY,
        request__bid_source=BidSource.AUTOBID,
        created_at__gte=start,
        created_at__lt=end,
    ).aggregate(total=Sum("amount"))["total"]
    return total or ZERO


def _agent(auto: Autobidder, now: datetime) -> tuple[PacingAgent, Decimal]:
    window = window_for(period=auto.period, now=now)
    spent = _spent(
        tenant_id=auto.tenant_id, start=window.start, end=now + timedelta(microseconds=1)
    )
    agent = PacingAgent(
        budget=float(auto.budget),
        period_s=(window.end - window.start).total_seconds(),
        values={k: float(v) for k, v in auto.values.items()},
        eta=auto.eta,
        mu_max=auto.mu_max,
        mu=min(auto.mu, auto.mu_max),
        spent=float(spent),
        elapsed_s=(now - window.start).total_seconds(),
    )
    return agent, spent


def autobid(*, tenant: Tenant, request_class: str, now: datetime | None = None) -> AutoBid | None:
    """The autobidder's bid for a request of ``request_class``, or None when it does not bid
    (disabled, no autobidder, or no value for that class)."""
    auto = Autobidder.objects.filter(tenant=tenant, enabled=True).first()
    if auto is None or request_class not in auto.values:
        return None
    agent, spent = _agent(auto, now or timezone.now())
    # PacingAgent.bid's shading, with its budget bound taken exactly in Decimal: bid x
    # max_wait_s never exceeds what is left. Both round down to the tick.
    shaded = Decimal(auto.values[request_class]) / Decimal(repr(1.0 + agent.mu))
    remaining = max(auto.budget - spent, ZERO)
    cap = remaining / Decimal(repr(auto.max_wait_s))
    bid = min(shaded, cap).quantize(TICK, rounding=ROUND_FLOOR)
    return AutoBid(bid=max(bid, ZERO), max_wait_s=auto.max_wait_s, mu=agent.mu)


def autobidder_step(
    *, tenant: Tenant, interval_s: float, now: datetime | None = None
) -> AutobidderStep | None:
    """One pacing step: read the spend of the last ``interval_s`` seconds, move mu, record it.

    Returns None when the tenant has no enabled autobidder.
    """
    now = now or timezone.now()
    with transaction.atomic():
        auto = Autobidder.objects.select_for_update().filter(tenant=tenant, enabled=True).first()
        if auto is None:
            return None
        start = now - timedelta(seconds=interval_s)
        window = window_for(period=auto.period, now=now)
        start = max(start, window.start)
        interval = max((now - start).total_seconds(), 1e-6)
        before, window_spent = _agent(auto, start)
        step_spent = _spent(tenant_id=tenant.pk, start=start, end=now)
        target = before.target(interval)
        mu = before.observe(float(step_spent), interval)
        auto.mu = mu
        auto.save(update_fields=["mu", "updated_at"])
        return AutobidderStep.objects.create(
            autobidder=auto,
            at=now,
            mu=mu,
            spent=step_spent,
            target=money(target),
            window_spent=window_spent + step_spent,
        )
