"""Reads of the market app: markets, the reserve's audit trail, and the console's history."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import Count, F, FloatField, IntegerField, OuterRef, QuerySet, Subquery, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, TruncMinute
from django.utils import timezone

from accounts.models import ChargeKind, LedgerEntry, Request, RequestStatus
from accounts.money import ZERO
from market.models import ControlChange, Market, ReserveChange
from mechanism.quotes import HISTORY_MAX, WINDOW_S, Waited
from mechanism.requests import effective_bid
from mechanism.reserve import Finished


def markets_active() -> QuerySet[Market]:
    """The markets currently open, by slug."""
    return Market.objects.filter(is_active=True).order_by("slug")


def market_by_slug(*, slug: str) -> Market:
    """The market with ``slug`` (Market.DoesNotExist when there is none)."""
    return Market.objects.get(slug=slug)


def quote_history(
    *,
    market: Market,
    now: datetime | None = None,
    window_s: float = WINDOW_S,
    limit: int = HISTORY_MAX,
) -> list[Waited]:
    """What ``market``'s recent served requests bid and waited: each one's bid as it would buy
    priority at the reserve now, its time to first token (seconds) and the queue it joined
    (its priority entry's ``queue_len``, None when the engine reported none)."""
    now = now or timezone.now()
    queue_len = LedgerEntry.objects.filter(
        request=OuterRef("pk"), kind=ChargeKind.PRIORITY
    ).values_list(Cast(KeyTextTransform("queue_len", "detail"), IntegerField()))[:1]
    rows = (
        Request.objects.filter(
            market=market,
            status=RequestStatus.SERVED,
            ttft_s__isnull=False,
            created_at__gte=now - timedelta(seconds=window_s),
        )
        .order_by("-created_at")
        .values_list("bid", "ttft_s", Subquery(queue_len))[:limit]
    )
    reserve = market.reserve
    return [
        Waited(float(effective_bid(bid, reserve, zero=ZERO)), ttft, queue)
        for bid, ttft, queue in rows
    ]


def finished_in_interval(*, market: Market, since: datetime, until: datetime) -> list[Finished]:
    """What ``market``'s requests served in (``since``, ``until``] bid ($/s, as sent) and
    waited for their first token (seconds): what the automatic reserve's step reads."""
    rows = Request.objects.filter(
        market=market,
        status=RequestStatus.SERVED,
        ttft_s__isnull=False,
        finished_at__gt=since,
        finished_at__lte=until,
    ).values_list("bid", "ttft_s")
    return [Finished(bid=float(bid), ttft_s=ttft) for bid, ttft in rows]


def served_waits(*, market: Market, limit: int) -> list[float]:
    """The times to first token (seconds) of ``market``'s last ``limit`` served requests, newest
    first: what the automatic wait bound reads."""
    rows = (
        Request.objects.filter(market=market, status=RequestStatus.SERVED, ttft_s__isnull=False)
        .order_by("-finished_at", "-request_id")
        .values_list("ttft_s", flat=True)[:limit]
    )
    return list(rows)


def reserve_changes_for_market(*, market: Market, limit: int = 50) -> QuerySet[ReserveChange]:
    """The latest reserve changes of ``market``, newest first."""
    return ReserveChange.objects.filter(market=market).select_related("changed_by")[:limit]


def control_changes_for_market(*, market: Market, limit: int = 50) -> QuerySet[ControlChange]:
    """The latest policy switches and ceiling moves of ``market``, newest first."""
    return ControlChange.objects.filter(market=market).select_related("changed_by")[:limit]


@dataclass(frozen=True)
class MinuteRevenue:
    """One minute of a market: what it earned and the welfare of what it served."""

    minute: datetime  # start of the minute, UTC
    priority: Decimal  # dollars of priority charges settled in it
    tokens: Decimal  # dollars of token charges
    welfare: float  # planned welfare, dollars (mechanism.welfare.planned_welfare)
    requests: int  # requests whose priority charge settled in it


def revenue_per_minute(
    *, market: Market, minutes: int = 60, now: datetime | None = None
) -> list[MinuteRevenue]:
    """The last ``minutes`` minutes of ``market`` (the current one last), zero-filled, from the
    ledger. Welfare is the planned welfare (``mechanism.welfare.planned_welfare``) of the
    priority entries, summed in the database from their detail (docs/mechanism.md, "Welfare")."""
    if minutes < 1:
        raise ValueError("minutes must be at least 1")
    now = (now or timezone.now()).astimezone(UTC)
    last = now.replace(second=0, microsecond=0)
    first = last - timedelta(minutes=minutes - 1)
    entries = LedgerEntry.objects.filter(market=market, created_at__gte=first).annotate(
        minute=TruncMinute("created_at", tzinfo=UTC)
    )
    money: dict[tuple[datetime, str], Decimal] = {}
    for row in entries.values("minute", "kind").annotate(amount=Sum("amount")):
        money[(row["minute"].astimezone(UTC), row["kind"])] = row["amount"]
    welfare: dict[datetime, tuple[float, int]] = {}
    priority = (
        entries.filter(kind=ChargeKind.PRIORITY)
        .annotate(
            eff=Cast(KeyTextTransform("effective_bid", "detail"), FloatField()),
            done=Cast(KeyTextTransform("planned_completion_s", "detail"), FloatField()),
        )
        .values("minute")
        .annotate(product=Sum(F("eff") * F("done"), output_field=FloatField()), n=Count("pk"))
    )
    for row in priority:
        welfare[row["minute"].astimezone(UTC)] = (-(row["product"] or 0.0), row["n"] or 0)
    result = []
    for i in range(minutes):
        minute = first + timedelta(minutes=i)
        w, n = welfare.get(minute, (0.0, 0))
        result.append(
            MinuteRevenue(
                minute=minute,
                priority=money.get((minute, ChargeKind.PRIORITY), ZERO),
                tokens=money.get((minute, ChargeKind.TOKENS), ZERO),
                welfare=w + 0.0,
                requests=n,
            )
        )
    return result
