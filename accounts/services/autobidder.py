"""The autobidder's writes: its settings, the bid it makes for a request, its pacing steps.

The state between calls is on the tenant's :class:`Autobidder` row: the multiplier ``mu`` (kept
from one window to the next: the warm start) and the exposure factor. The budget window and what
was spent in it are read from the clock, the row's counter and the ledger each time, so, as for
budgets, nothing resets by a job. Bids are quantized to whole nano-dollars per second with the
money rule.

**The safety rule** (docs/mechanism.md, "The safety rule"; the benchmark runs the same functions,
``mechanism.pacing``): settlement writes each priority charge of an autobid request as at
most what is left of the autobidder's budget, with its row locked (``accounts.ledger``), so the
budget is never overspent however many requests are in flight. Here, the bid keeps an exposure
reserve: the exposure factor (a high quantile of charge / worst case over recent requests) times
the worst cases of the requests whose priority charge has not settled yet; a request is bid 0
when what is left does not cover it (``safe_bid``). Each request's worst case, bid x
``max_wait_s``, is still its consent cap (``priority_cap``) and held against the tenant's budget,
not the autobidder's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from decimal import ROUND_FLOOR, Decimal

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from accounts.models import (
    Autobidder,
    AutobidderStep,
    AutobidPeriod,
    BidSource,
    ChargeKind,
    Hold,
    HoldState,
    LedgerEntry,
    Request,
    Tenant,
)
from accounts.money import QUANTUM as TICK
from accounts.money import ZERO, money, money_exact
from accounts.selectors.collection import collection
from accounts.windows import window_for
from mechanism.pacing import (
    DEFAULT_ETA0,
    EXPOSURE_WINDOW,
    PacingAgent,
    exposure_factor,
    mu_max_for,
    safe_bid,
)

DEFAULT_MU_CEILING = 1000.0  # the derived mu_max is never above the row's mu_max
# The advisory lock space of autobid admissions (PostgreSQL's two-int form: space, tenant id).
AUTOBID_LOCK_SPACE = 0x61627064  # "abpd"


@dataclass(frozen=True)
class LatencyTarget:
    """A request class's target instead of a value: a first token within ``ttft_s`` seconds
    with probability ``p``. The class is worth, per second of waiting, what the market quotes
    for that target now (``GET /v1/quotes``' rule, computed where the request is admitted)."""

    ttft_s: float
    p: float


ClassSetting = Decimal | LatencyTarget
# The bid a latency target is worth now, dollars per second: the gateway's quote for it in the
# request's market, under the tenant's cap (accounts cannot read a market's history itself).
Quoted = Callable[[LatencyTarget], Decimal]


def class_setting(name: str, raw: object) -> ClassSetting:
    """A request class's entry in ``values``: a value (dollars per second of waiting, a decimal
    string or number) or a latency target ``{"ttft_s": T, "p": p}`` with T > 0 seconds and
    0 < p < 1. ValueError naming the class and what is wrong."""
    if not isinstance(raw, dict):
        try:
            return money_exact(raw)  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            raise ValueError(f"request class {name!r}: {exc}") from None
    if set(raw) != {"ttft_s", "p"}:
        raise ValueError(
            f'request class {name!r}: a latency target is {{"ttft_s": T, "p": p}} exactly, '
            f"got the keys {sorted(raw)}"
        )
    ttft_s, p = raw["ttft_s"], raw["p"]
    for label, number in (("ttft_s", ttft_s), ("p", p)):
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise ValueError(f"request class {name!r}: {label} must be a number, got {number!r}")
    if not (math.isfinite(ttft_s) and ttft_s > 0):
        raise ValueError(f"request class {name!r}: ttft_s must be > 0 seconds, got {ttft_s!r}")
    if not 0 < p < 1:
        raise ValueError(f"request class {name!r}: p must lie strictly between 0 and 1, got {p!r}")
    return LatencyTarget(ttft_s=float(ttft_s), p=float(p))


@dataclass(frozen=True)
class AutoBid:
    """The autobidder's bid for one request, and its consent cap."""

    bid: Decimal  # dollars per second of waiting
    max_wait_s: float  # the planned-wait bound of its consent cap
    mu: float

    @property
    def worst_case(self) -> Decimal:
        """The most its priority charge can be (bid x planned wait bound), dollars: the
        request's ``priority_cap``."""
        return money(self.bid * Decimal(repr(self.max_wait_s)))


def autobidder_configure(
    *,
    tenant: Tenant,
    enabled: bool,
    budget: Decimal | str,
    period: str = AutobidPeriod.DAY,
    values: dict[str, Decimal | str | dict[str, float]],
    max_wait_s: float = 60.0,
    eta: float = DEFAULT_ETA0,
    mu_max: float = DEFAULT_MU_CEILING,
) -> Autobidder:
    """Create or change a tenant's autobidder; ValueError naming the bad setting.

    ``eta`` is the step's eta0 (the step is eta0 / sqrt(updates per window)); ``mu_max`` a
    ceiling on the multiplier bound each step derives (``mu_max_for``). Changing settings keeps
    the multiplier (clipped to the new ``mu_max``): a change mid-window does not start the
    pacing over. A class's entry in ``values`` is a value or a latency target
    (:func:`class_setting`).
    """
    if period not in AutobidPeriod.values:
        raise ValueError(f"unknown autobidder period {period!r}")
    budget = money_exact(budget)
    clean: dict[str, str | dict[str, float]] = {}
    for name, value in values.items():
        if not isinstance(name, str) or not name or len(name) > 50:
            raise ValueError(f"bad request class name {name!r}")
        setting = class_setting(name, value)
        clean[name] = asdict(setting) if isinstance(setting, LatencyTarget) else str(setting)
    if enabled and not clean:
        raise ValueError("an enabled autobidder needs a value for at least one request class")
    for label, number in (("max_wait_s", max_wait_s), ("eta", eta), ("mu_max", mu_max)):
        if not isinstance(number, int | float) or not math.isfinite(number) or number <= 0:
            raise ValueError(f"{label} must be a finite number > 0.0, got {number!r}")
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


def autobid_in_flight(*, tenant_id: int) -> Decimal:
    """The worst cases (``priority_cap``) of the tenant's autobid requests whose priority charge
    has not settled: their hold is still open and no priority entry is written, dollars."""
    open_holds = Hold.objects.filter(tenant_id=tenant_id, state=HoldState.OPEN).values("request_id")
    total = (
        Request.objects.filter(
            tenant_id=tenant_id, bid_source=BidSource.AUTOBID, request_id__in=open_holds
        )
        .exclude(ledger_entries__kind=ChargeKind.PRIORITY)
        .aggregate(total=Sum("priority_cap"))["total"]
    )
    return total or ZERO


def autobids(*, tenant: Tenant, request_class: str) -> bool:
    """Whether the tenant's autobidder bids for ``request_class`` (enabled, with a value)."""
    return Autobidder.objects.filter(
        tenant=tenant, enabled=True, values__has_key=request_class
    ).exists()


@contextmanager
def autobid_admission(*, tenant: Tenant) -> Iterator[None]:
    """One transaction in which a tenant's autobid request is bid (``autobid``) and opened
    (``request_open``), one such admission of a tenant at a time, so that each sees the requests
    in flight that the others opened: without it, a burst of concurrent requests all see nothing
    in flight and all bid as if alone (20 at once gave away 3x the budget in the money test).

    A transaction-scoped advisory lock on the tenant: it does not touch the rows settlement
    locks (request, hold, counters, autobidder, in that order), so the two cannot deadlock.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [AUTOBID_LOCK_SPACE, tenant.pk])
        yield


def autobid(
    *,
    tenant: Tenant,
    request_class: str,
    now: datetime | None = None,
    quoted: Quoted | None = None,
) -> AutoBid | None:
    """The autobidder's bid for a request of ``request_class``, or None when it does not bid
    (disabled, no autobidder, or no value for that class): the shaded value within the safety
    rule's exposure reserve (``safe_bid``, exactly in Decimal), rounded down to the tick.

    A class with a latency target is worth ``quoted(target)`` (the caller's quote for it), then
    shaded and capped the same way, so its spend stays within the same budget."""
    auto = Autobidder.objects.filter(tenant=tenant, enabled=True).first()
    if auto is None or request_class not in auto.values:
        return None
    now = now or timezone.now()
    setting = class_setting(request_class, auto.values[request_class])
    if isinstance(setting, LatencyTarget):
        if quoted is None:
            raise ValueError(
                f"request class {request_class!r} has a latency target: no quote given"
            )
        setting = quoted(setting)
    shaded = setting / Decimal(repr(1.0 + auto.mu))
    bid = safe_bid(
        shaded=shaded,
        remaining=max(auto.budget_left(now=now), ZERO),
        in_flight=autobid_in_flight(tenant_id=tenant.pk),
        factor=Decimal(repr(auto.exposure_factor)),
        wait_bound_s=Decimal(repr(auto.max_wait_s)),
    )
    bid = Decimal(bid).quantize(TICK, rounding=ROUND_FLOOR)
    return AutoBid(bid=max(bid, ZERO), max_wait_s=auto.max_wait_s, mu=auto.mu)


def autobid_ratios(*, tenant_id: int, limit: int = EXPOSURE_WINDOW) -> list[float]:
    """Charge asked / worst case of the tenant's last ``limit`` settled autobid requests: what
    the engine asked (before any cap), over the request's ``priority_cap``."""
    rows = (
        LedgerEntry.objects.filter(
            tenant_id=tenant_id,
            kind=ChargeKind.PRIORITY,
            request__bid_source=BidSource.AUTOBID,
            request__priority_cap__gt=0,
        )
        .order_by("-created_at")
        .values_list("amount", "detail", "request__priority_cap")[:limit]
    )
    return [float(Decimal(d.get("uncapped", amount)) / cap) for amount, d, cap in rows]


def autobid_uncollected(*, tenant_id: int, start: datetime, end: datetime) -> Decimal:
    """What the autobidder's budget cut from priority charges in [start, end): the charges the
    market gave away because the budget ran out, dollars (``collection``'s ``given_away``)."""
    return collection(start=start, end=end, tenant_id=tenant_id).given_away


def _arrival_rate(*, tenant_id: int, start: datetime, now: datetime) -> float | None:
    """Autobid requests a second since ``start``; None before any."""
    n = Request.objects.filter(
        tenant_id=tenant_id, bid_source=BidSource.AUTOBID, created_at__gte=start, created_at__lt=now
    ).count()
    seconds = (now - start).total_seconds()
    return n / seconds if n and seconds > 0 else None


def _value_bound(name: str, raw: object, tenant: Tenant) -> float:
    """The most a class is worth, $/s, for the multiplier's bound: its value, or for a latency
    target the tenant's ``priority_bid_cap`` (the gateway never values a quote above it)."""
    setting = class_setting(name, raw)
    return float(tenant.priority_bid_cap if isinstance(setting, LatencyTarget) else setting)


def autobidder_step(
    *, tenant: Tenant, interval_s: float, now: datetime | None = None, every_s: float | None = None
) -> AutobidderStep | None:
    """One pacing step: read the spend of the last ``interval_s`` seconds, move mu, record it.

    ``every_s``: how often steps are taken (default ``interval_s``, which a late step exceeds);
    the window over it is the steps in a window, T, of the step size eta0 / sqrt(T). mu_max is
    derived from the values, the arrival rate of autobid requests in the window so far and the
    target rate (``mu_max_for``), within the row's ``mu_max``. The exposure factor is renewed
    from the recent settled requests. Returns None when the tenant has no enabled autobidder.
    """
    now = now or timezone.now()
    with transaction.atomic():
        auto = Autobidder.objects.select_for_update().filter(tenant=tenant, enabled=True).first()
        if auto is None:
            return None
        window = window_for(period=auto.period, now=now)
        start = max(now - timedelta(seconds=interval_s), window.start)
        interval = max((now - start).total_seconds(), 1e-6)
        period_s = (window.end - window.start).total_seconds()
        before = _spent(tenant_id=tenant.pk, start=window.start, end=start)
        step_spent = _spent(tenant_id=tenant.pk, start=start, end=now)
        values = {k: _value_bound(k, v, tenant) for k, v in auto.values.items()}
        rate = _arrival_rate(tenant_id=tenant.pk, start=window.start, now=now)
        mu_max = auto.mu_max
        if rate is not None:
            derived = mu_max_for(
                value_max=max(values.values()),
                arrival_rate=rate,
                wait_bound_s=auto.max_wait_s,
                target_rate=float(auto.budget) / period_s,
            )
            mu_max = min(mu_max, derived)
        agent = PacingAgent(
            budget=float(auto.budget),
            period_s=period_s,
            values=values,
            updates=max(1, math.ceil(period_s / max(every_s or interval_s, 1e-6))),
            eta0=auto.eta,
            mu_max=mu_max,
            mu=min(auto.mu, mu_max),
            spent=float(before),
            elapsed_s=(start - window.start).total_seconds(),
        )
        target = agent.target(interval)
        mu = agent.observe(float(step_spent), interval)
        auto.mu = mu
        auto.exposure_factor = exposure_factor(autobid_ratios(tenant_id=tenant.pk))
        auto.save(update_fields=["mu", "exposure_factor", "updated_at"])
        return AutobidderStep.objects.create(
            autobidder=auto,
            at=now,
            mu=mu,
            spent=step_spent,
            target=money(target),
            window_spent=before + step_spent,
            exposure_factor=auto.exposure_factor,
            in_flight=autobid_in_flight(tenant_id=tenant.pk),
            uncollected=autobid_uncollected(tenant_id=tenant.pk, start=window.start, end=now),
        )
