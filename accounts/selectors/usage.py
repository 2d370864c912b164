"""A tenant's usage and costs in time buckets, read from the ledger: what the tenant API's
``GET /v1/organization/usage/completions`` and ``GET /v1/organization/costs`` answer, in
OpenAI's shape (a page of buckets, each with its results).

Buckets are aligned to UTC: a ``1m``, ``1h`` or ``1d`` bucket starts at a multiple of 60, 3,600
or 86,400 seconds of Unix time, the width the database truncates to (``Trunc``). Each bucket
is clipped to the asked window ``[start_time, end_time)``, so the first and last may be
narrower than the width, and nothing outside the window is counted.
A bucket is half-open: a row at its ``end_time`` is the next bucket's.

Usage counts served requests (status ``served``) by the second they finished; failed requests
are never charged and are not counted. Costs sum the ledger's entries by the second each was
charged, in SQL over the exact ``Decimal`` column, written as decimal strings with 9 places.
A page holds at most ``limit`` buckets, empty ones included; ``next_page`` is the Unix second
at which the next page's first bucket starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import Count, QuerySet, Sum
from django.db.models.functions import Coalesce, Trunc

from accounts.models import LedgerEntry, Request, RequestStatus
from accounts.money import money_str

LATEST_UNIX_S = 253_402_300_799  # 9999-12-31T23:59:59Z, the last second a datetime holds
# bucket_width -> (seconds, the unit Trunc truncates to)
BUCKET_WIDTHS: dict[str, tuple[int, str]] = {
    "1m": (60, "minute"),
    "1h": (3_600, "hour"),
    "1d": (86_400, "day"),
}
DEFAULT_BUCKET_WIDTH = "1d"
# bucket_width -> (buckets a page holds unless told, the most it may hold): OpenAI's figures.
PAGE_LIMITS: dict[str, tuple[int, int]] = {"1m": (60, 1_440), "1h": (24, 168), "1d": (7, 31)}

# group_by name -> the column it groups by. A Request (usage) and a LedgerEntry (costs) both
# carry their market and key; a request class is the request's, a line item the entry's kind.
USAGE_GROUPS: dict[str, str] = {
    "model": "market__served_model",
    "market": "market__slug",
    "api_key_id": "api_key__prefix",
    "request_class": "request_class",
}
COST_GROUPS: dict[str, str] = {
    "line_item": "kind",
    "model": "market__served_model",
    "market": "market__slug",
    "api_key_id": "api_key__prefix",
    "request_class": "request__request_class",
}


@dataclass(frozen=True)
class UsageQuery:
    """One page of buckets asked for: the window ``[start_time, end_time)`` in Unix seconds,
    the width's name (``BUCKET_WIDTHS``), the group_by names, at most ``limit`` buckets, from
    the bucket starting at ``page`` (Unix seconds, aligned; None: the window's first)."""

    start_time: int
    end_time: int
    bucket_width: str
    group_by: tuple[str, ...]
    limit: int
    page: int | None = None

    @property
    def width_s(self) -> int:
        return BUCKET_WIDTHS[self.bucket_width][0]

    @property
    def first_bucket(self) -> int:
        """The aligned start of the bucket holding ``start_time``, Unix seconds."""
        return self.start_time - self.start_time % self.width_s


def usage_page_edges(query: UsageQuery) -> tuple[list[tuple[int, int]], int | None]:
    """The page's buckets as (start, end) Unix seconds, clipped to the window, and the aligned
    start of the next page's first bucket (None on the last page)."""
    width = query.width_s
    aligned = query.first_bucket if query.page is None else query.page
    edges: list[tuple[int, int]] = []
    while aligned < query.end_time and len(edges) < query.limit:
        edges.append((max(aligned, query.start_time), min(aligned + width, query.end_time)))
        aligned += width
    return edges, (aligned if aligned < query.end_time else None)


def _at(second: int) -> datetime:
    return datetime.fromtimestamp(second, tz=UTC)


def _page(
    query: UsageQuery,
    rows: QuerySet[Any, Any],
    time_field: str,
    groups: dict[str, str],
    result: Callable[[QuerySet[Any, dict[str, Any]]], list[dict[str, Any]]],
) -> dict[str, Any]:
    """The answer: ``rows`` (a queryset of the page's window) summed per bucket and group by
    the database; ``result(grouped)`` puts each summed row's answer under its ``"result"``, and
    the groups' fields go beside it (null for a field not grouped by)."""
    edges, next_page = usage_page_edges(query)
    by_bucket: dict[int, list[dict[str, Any]]] = {start: [] for start, _ in edges}
    if edges:
        columns = [groups[name] for name in query.group_by]
        kind = BUCKET_WIDTHS[query.bucket_width][1]
        window = {f"{time_field}__gte": _at(edges[0][0]), f"{time_field}__lt": _at(edges[-1][1])}
        grouped = (
            rows.filter(**window)
            .annotate(bucket=Trunc(time_field, kind, tzinfo=UTC))
            .values("bucket", *columns)
            .order_by("bucket", *columns)
        )
        for row in result(grouped):
            aligned = int(row["bucket"].timestamp())
            start = max(aligned, query.start_time)
            fields = {name: row[groups[name]] for name in query.group_by}
            if fields.get("api_key_id") is not None:
                fields["api_key_id"] = f"im_{fields['api_key_id']}"
            by_bucket[start].append(
                {**row["result"], **{name: fields.get(name) for name in groups}}
            )
    return {
        "object": "page",
        "data": [
            {"object": "bucket", "start_time": start, "end_time": end, "results": by_bucket[start]}
            for start, end in edges
        ],
        "has_more": next_page is not None,
        "next_page": None if next_page is None else str(next_page),
    }


def completions_usage_for_tenant(*, tenant_id: int, query: UsageQuery) -> dict[str, Any]:
    """The tenant's served requests per bucket (and group): input tokens (cached ones
    included, as OpenAI counts them), cached input tokens, output tokens, requests."""

    sums = {
        "input_tokens": Coalesce(Sum("prompt_tokens"), 0),
        "input_cached_tokens": Coalesce(Sum("cached_tokens"), 0),
        "output_tokens": Coalesce(Sum("completion_tokens"), 0),
        "num_model_requests": Count("request_id"),
    }

    def result(rows: QuerySet[Any, dict[str, Any]]) -> list[dict[str, Any]]:
        kind = {"object": "organization.usage.completions.result"}
        return [
            {**row, "result": {**kind, **{k: row[k] for k in sums}}}
            for row in rows.annotate(**sums)
        ]

    served = Request.objects.filter(tenant_id=tenant_id, status=RequestStatus.SERVED)
    return _page(query, served, "finished_at", USAGE_GROUPS, result)


def costs_for_tenant(*, tenant_id: int, query: UsageQuery) -> dict[str, Any]:
    """The tenant's ledger charges per bucket (and group), exact dollars; grouped by
    ``line_item``, the token charges (``tokens``) and priority charges (``priority``) apart."""

    def result(rows: QuerySet[Any, dict[str, Any]]) -> list[dict[str, Any]]:
        summed = rows.annotate(amount=Sum("amount"))
        return [
            {
                **row,
                "result": {
                    "object": "organization.costs.result",
                    "amount": {"value": money_str(row["amount"]), "currency": "usd"},
                },
            }
            for row in summed
        ]

    entries = LedgerEntry.objects.filter(tenant_id=tenant_id)
    return _page(query, entries, "created_at", COST_GROUPS, result)
