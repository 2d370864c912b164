"""Reads for the live tenant dashboard and the operators' tenants table (read-only).

Each function is scoped to one tenant, except :func:`tenants_active_since`, which operators'
publishers use to find whose spend moved. Amounts are exact ``Decimal`` dollars; bids are
dollars per second of waiting; latencies seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Sum
from django.db.models.functions import TruncHour, TruncMinute

from accounts.models import AutobidderStep, ChargeKind, LedgerEntry, Request, Tenant
from accounts.money import ZERO


@dataclass(frozen=True)
class RequestWhy:
    """One request of a tenant and why it ranked where it did (from its round's record)."""

    request_id: str
    created_at: datetime
    market: str
    request_class: str
    status: str
    bid: Decimal  # $/s as sent
    bid_source: str
    ttft_s: float | None
    e2e_s: float | None
    priority_charge: Decimal | None  # dollars; None until its round is settled
    token_charge: Decimal | None  # dollars; None until it completes
    detail: dict[str, Any]  # the priority entry's detail: effective bid, position, block, ...


@dataclass(frozen=True)
class LatencyPoint:
    request_id: str
    at: datetime  # when the request finished
    request_class: str
    ttft_s: float | None
    e2e_s: float | None


@dataclass(frozen=True)
class SpendPoint:
    at: datetime  # end of the bucket
    cumulative: Decimal  # dollars spent from the window's start to ``at``


def spent_since(*, tenant: Tenant, since: datetime) -> Decimal:
    """Dollars charged to ``tenant`` from ``since`` on."""
    entries = LedgerEntry.objects.filter(tenant=tenant, created_at__gte=since)
    return entries.aggregate(total=Sum("amount"))["total"] or ZERO


def requests_why(
    *, tenant: Tenant, request_ids: list[str] | None = None, limit: int = 25
) -> list[RequestWhy]:
    """The tenant's requests (the given ones, else its latest ``limit``), newest first, with
    their charges and the "why this rank" detail of their priority entry."""
    requests = Request.objects.filter(tenant=tenant).select_related("market")
    if request_ids is not None:
        requests = requests.filter(request_id__in=request_ids)
    requests = list(requests.order_by("-created_at", "-request_id")[:limit])
    entries: dict[tuple[str, str], LedgerEntry] = {
        (e.request_id, e.kind): e
        for e in LedgerEntry.objects.filter(
            tenant=tenant, request_id__in=[r.request_id for r in requests]
        )
    }
    result = []
    for r in requests:
        priority = entries.get((r.request_id, ChargeKind.PRIORITY))
        tokens = entries.get((r.request_id, ChargeKind.TOKENS))
        result.append(
            RequestWhy(
                request_id=r.request_id,
                created_at=r.created_at,
                market=r.market.slug,
                request_class=r.request_class,
                status=r.status,
                bid=r.bid,
                bid_source=r.bid_source,
                ttft_s=r.ttft_s,
                e2e_s=r.e2e_s,
                priority_charge=priority.amount if priority else None,
                token_charge=tokens.amount if tokens else None,
                detail=dict(priority.detail) if priority else {},
            )
        )
    return result


def latency_points(*, tenant: Tenant, since: datetime, limit: int = 2000) -> list[LatencyPoint]:
    """Latencies of the tenant's requests served since ``since`` (at most ``limit``, the latest),
    oldest first."""
    rows = (
        Request.objects.filter(tenant=tenant, finished_at__gte=since)
        .exclude(ttft_s=None, e2e_s=None)
        .order_by("-finished_at")
        .values_list("request_id", "finished_at", "request_class", "ttft_s", "e2e_s")[:limit]
    )
    return [LatencyPoint(*row) for row in reversed(rows)]


def spend_cumulative(
    *, tenant: Tenant, start: datetime, until: datetime, bucket: str = "minute"
) -> list[SpendPoint]:
    """The tenant's cumulative spend from ``start``, one point per non-empty ``bucket``
    ("minute" or "hour") up to ``until``, each at the end of its bucket."""
    trunc = TruncMinute if bucket == "minute" else TruncHour
    step = timedelta(minutes=1) if bucket == "minute" else timedelta(hours=1)
    rows = (
        LedgerEntry.objects.filter(tenant=tenant, created_at__gte=start, created_at__lt=until)
        .annotate(bucket=trunc("created_at", tzinfo=UTC))
        .values("bucket")
        .annotate(amount=Sum("amount"))
        .order_by("bucket")
    )
    total = ZERO
    points = []
    for row in rows:
        total += row["amount"]
        points.append(SpendPoint(at=min(row["bucket"] + step, until), cumulative=total))
    return points


def autobidder_steps(
    *, tenant: Tenant, since: datetime, limit: int = 1000
) -> list[tuple[datetime, float, Decimal]]:
    """(time, multiplier, dollars its budget had paid in its window) of the tenant's
    autobidder's pacing steps since ``since``, oldest first (at most the latest ``limit``)."""
    rows = (
        AutobidderStep.objects.filter(autobidder__tenant=tenant, at__gte=since)
        .order_by("-at")
        .values_list("at", "mu", "window_spent")[:limit]
    )
    return list(reversed(rows))


def autobidder_latest(*, tenant: Tenant) -> tuple[datetime, float, Decimal] | None:
    """(time, multiplier, window spend) of the autobidder's latest step, or None."""
    return (
        AutobidderStep.objects.filter(autobidder__tenant=tenant)
        .order_by("-at")
        .values_list("at", "mu", "window_spent")
        .first()
    )


def tenants_active_since(*, since: datetime) -> dict[int, list[str]]:
    """Tenants with ledger entries created since ``since``: tenant id -> those requests (a
    request charged twice is named twice; the spend tick takes each once)."""
    active: dict[int, list[str]] = {}
    rows = LedgerEntry.objects.filter(created_at__gte=since).values_list("tenant_id", "request_id")
    for tenant_id, request_id in rows[:5000]:
        active.setdefault(tenant_id, []).append(request_id)
    return active
