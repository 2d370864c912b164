"""Spend ticks: a tenant's spend, sent to its own group when its charges settle.

A tick carries the tenant's whole current state (budget window spend, today's spend, the
autobidder's latest multiplier) plus the rows of the requests that just changed, so a browser
that missed ticks is right again with the next one. Each tenant's tick goes to its group only;
operators get the spend line without the requests (``tenant.spend``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from django.utils import timezone

from accounts.models import Tenant
from accounts.money import money_str
from accounts.selectors.budgets import BudgetStatus, budget_status
from accounts.selectors.live import RequestWhy, autobidder_latest, requests_why, spent_since
from accounts.windows import window_for
from market.live.send import group_send_many
from market.payloads import (
    OPERATORS_GROUP,
    AutobidderPoint,
    BudgetLine,
    Payload,
    RequestRow,
    SpendTick,
    TenantSpend,
    tenant_group,
)

ROWS_PER_TICK = 50  # at most this many request rows in one tick (the newest)


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _money(value: object) -> str | None:
    return None if value is None else money_str(value)  # type: ignore[arg-type]


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def request_row(why: RequestWhy) -> RequestRow:
    """The payload row of one request (``RequestWhy`` from the accounts selectors)."""
    detail = why.detail
    block = detail.get("block") if isinstance(detail.get("block"), dict) else {}
    engine = detail.get("engine")  # the replica it waited at (its round record's engine id)
    return {
        "request_id": why.request_id,
        "at": why.created_at.timestamp(),
        "market": why.market,
        "request_class": why.request_class,
        "status": why.status,
        "bid": money_str(why.bid),
        "bid_source": why.bid_source,
        "effective_bid": _float(detail.get("effective_bid")),
        "position": _int(detail.get("position")),
        "rank": _int(detail.get("rank")),
        "ahead": _int(detail.get("ahead")),
        "queue_len": _int(detail.get("queue_len")),
        "block_bid_mean": _float(block.get("bid_mean")),
        "block_density": _float(block.get("density")),
        "block_requests": _int(block.get("requests")),
        "engine": engine if isinstance(engine, str) else None,
        "time_saved_s": _float(detail.get("time_saved_s")),
        "priority_charge": _money(why.priority_charge),
        "token_charge": _money(why.token_charge),
        "ttft_s": why.ttft_s,
        "e2e_s": why.e2e_s,
    }


def budget_line(status: BudgetStatus | None) -> BudgetLine | None:
    """The payload form of a budget status (amounts as exact dollar strings)."""
    if status is None:
        return None
    return {
        "period": status.period,
        "limit": money_str(status.limit),
        "spent": money_str(status.spent),
        "held": money_str(status.held),
        "remaining": money_str(status.remaining),
        "window_start": status.window_start.timestamp(),
        "resets_at": status.resets_at.timestamp() if status.resets_at else None,
    }


def autobidder_point(tenant: Tenant) -> AutobidderPoint | None:
    latest = autobidder_latest(tenant=tenant)
    if latest is None:
        return None
    at, mu, spent = latest
    return {"at": at.timestamp(), "mu": mu, "spent": money_str(spent)}


def spend_tick(
    *, tenant: Tenant, request_ids: Iterable[str] = (), now: datetime | None = None
) -> SpendTick:
    """The tenant's spend now, with the rows of ``request_ids`` (the newest ``ROWS_PER_TICK``)."""
    now = now or timezone.now()
    ids = list(dict.fromkeys(request_ids))
    rows = (
        [request_row(w) for w in requests_why(tenant=tenant, request_ids=ids, limit=ROWS_PER_TICK)]
        if ids
        else []
    )
    status = budget_status(tenant=tenant, now=now)  # without a key: the tenant's own budget
    if status is not None:
        spent_window = status.spent
    else:
        spent_window = spent_since(tenant=tenant, since=window_for(period="month", now=now).start)
    today = window_for(period="day", now=now)
    return {
        "kind": "spend.tick",
        "tenant": tenant.slug,
        "at": now.timestamp(),
        "budget": budget_line(status),
        "spent_window": money_str(spent_window),
        "spent_today": money_str(spent_since(tenant=tenant, since=today.start)),
        "autobidder": autobidder_point(tenant),
        "requests": rows,
    }


def tenant_spend(*, tenant: Tenant, tick: SpendTick) -> TenantSpend:
    """The operators' line of a tenant, from its tick (no requests)."""
    return {
        "kind": "tenant.spend",
        "tenant": tenant.slug,
        "name": tenant.name,
        "at": tick["at"],
        "budget": tick["budget"],
        "spent_today": tick["spent_today"],
    }


def tenant_spend_now(*, tenant: Tenant, now: datetime | None = None) -> TenantSpend:
    """The operators' line of a tenant, read now: the part of a tick it needs, nothing more
    (the console's first paint reads it for every tenant)."""
    now = now or timezone.now()
    today = window_for(period="day", now=now)
    return {
        "kind": "tenant.spend",
        "tenant": tenant.slug,
        "name": tenant.name,
        "at": now.timestamp(),
        "budget": budget_line(budget_status(tenant=tenant, now=now)),
        "spent_today": money_str(spent_since(tenant=tenant, since=today.start)),
    }


def spend_ticks_publish(
    *, requests_by_tenant: Mapping[int, Iterable[str]], now: datetime | None = None
) -> int:
    """Send a tick to each tenant's group (and its line to the operators); returns how many."""
    if not requests_by_tenant:
        return 0
    tenants = Tenant.objects.in_bulk(list(requests_by_tenant))
    messages: list[tuple[str, Payload]] = []
    for tenant_id, request_ids in requests_by_tenant.items():
        tenant = tenants.get(tenant_id)
        if tenant is None:
            continue
        tick = spend_tick(tenant=tenant, request_ids=request_ids, now=now)
        messages.append((tenant_group(tenant.slug), tick))
        messages.append((OPERATORS_GROUP, tenant_spend(tenant=tenant, tick=tick)))
    group_send_many(messages)
    return len(messages) // 2
