"""Reads for the tenant dashboards, each scoped to one tenant. Amounts are exact dollars."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncHour
from django.utils import timezone

from accounts.models import ChargeKind, LedgerEntry, Tenant
from accounts.money import ZERO


@dataclass(frozen=True)
class HourSpend:
    hour: datetime  # start of the hour, UTC
    amount: Decimal  # dollars charged in it (both parts)


@dataclass(frozen=True)
class MarketCharges:
    market: str  # market slug
    requests: int  # requests with a charge in the range
    priority: Decimal
    tokens: Decimal

    @property
    def total(self) -> Decimal:
        return self.priority + self.tokens


@dataclass(frozen=True)
class TopRequest:
    request_id: str
    market: str
    round_id: str
    amount: Decimal  # the priority charge, dollars
    created_at: datetime


def spend_per_hour(
    *, tenant: Tenant, hours: int = 24, now: datetime | None = None
) -> list[HourSpend]:
    """The tenant's spend in each of the last ``hours`` UTC hours (the current one last),
    zero-filled."""
    if hours < 1:
        raise ValueError("hours must be at least 1")
    now = (now or timezone.now()).astimezone(UTC)
    last = now.replace(minute=0, second=0, microsecond=0)
    first = last - timedelta(hours=hours - 1)
    rows = (
        LedgerEntry.objects.filter(
            tenant=tenant, created_at__gte=first, created_at__lt=last + timedelta(hours=1)
        )
        .annotate(hour=TruncHour("created_at", tzinfo=UTC))
        .values("hour")
        .annotate(amount=Sum("amount"))
    )
    by_hour = {row["hour"].astimezone(UTC): row["amount"] for row in rows}
    return [
        HourSpend(hour=h, amount=by_hour.get(h, ZERO))
        for h in (first + timedelta(hours=i) for i in range(hours))
    ]


def charges_by_market(
    *, tenant: Tenant, since: datetime, until: datetime | None = None
) -> list[MarketCharges]:
    """The tenant's charges per market in ``[since, until)`` (until: the clock), by slug."""
    until = until or timezone.now()
    rows = (
        LedgerEntry.objects.filter(tenant=tenant, created_at__gte=since, created_at__lt=until)
        .values("market__slug")
        .annotate(
            requests=Count("request", distinct=True),
            priority=Sum("amount", filter=Q(kind=ChargeKind.PRIORITY)),
            tokens=Sum("amount", filter=Q(kind=ChargeKind.TOKENS)),
        )
        .order_by("market__slug")
    )
    return [
        MarketCharges(
            market=row["market__slug"],
            requests=row["requests"],
            priority=row["priority"] or ZERO,
            tokens=row["tokens"] or ZERO,
        )
        for row in rows
    ]


def top_requests_by_priority(
    *, tenant: Tenant, since: datetime, limit: int = 10
) -> list[TopRequest]:
    """The tenant's ``limit`` largest priority charges since ``since``, largest first."""
    entries = (
        LedgerEntry.objects.filter(tenant=tenant, kind=ChargeKind.PRIORITY, created_at__gte=since)
        .select_related("market")
        .order_by("-amount", "created_at", "request_id")[:limit]
    )
    return [
        TopRequest(
            request_id=e.request_id,
            market=e.market.slug,
            round_id=e.round_id,
            amount=e.amount,
            created_at=e.created_at,
        )
        for e in entries
    ]
