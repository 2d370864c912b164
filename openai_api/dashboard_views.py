"""The tenant dashboard: spend against budget with its pacing curve, latency by request class,
the autobidder's multiplier, recent requests and why they ranked where they did, invoices and
keys. Members of the tenant (and operators) only; anyone else gets 404, anonymous a login.

The live parts arrive over ``/ws/tenants/<slug>/`` (``market.consumers.TenantConsumer``) as
spend ticks, in the same shapes as the initial data rendered here (``market.payloads``). What a
bid buys at each market (the bid -> time to first token curve, from the quotes' computation,
``gateway.selectors.quote_curve``) is polled from ``tenant_quotes`` every ``QUOTES_POLL_S``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from accounts.forms import BatchUploadForm
from accounts.models import Autobidder, Tenant
from accounts.money import money_str
from accounts.selectors import (
    api_keys_for_tenant,
    can_manage_keys,
    invoices_for_tenant,
    role_for_user,
)
from accounts.selectors.live import (
    autobidder_steps,
    latency_points,
    requests_why,
    spend_cumulative,
)
from accounts.views import tenant_page
from accounts.windows import window_for
from market.live.spend import request_row, spend_tick
from market.models import Market
from market.payloads import SpendTick
from openai_api.batches.console_views import can_submit_batches
from openai_api.batches.selectors import batches_for_tenant
from openai_api.gateway.selectors import quote_curve

LATENCY_LOOKBACK = timedelta(hours=1)
AUTOBID_LOOKBACK = timedelta(hours=24)
RECENT_REQUESTS = 25
INVOICES_SHOWN = 6
BATCHES_SHOWN = 10
QUOTES_POLL_S = 10  # seconds between two reads of the quote curves by an open dashboard


def _quote_curves() -> list[dict[str, Any]]:
    """The bid -> time to first token curve of every active market (anonymous: bids and waits)."""
    return [quote_curve(market=m) for m in Market.objects.filter(is_active=True).order_by("slug")]


@require_GET
@tenant_page
def tenant_quotes(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """The dashboard's quote curves, as JSON: ``{"markets": [quote_curve, ...]}``."""
    return JsonResponse({"markets": _quote_curves(), "poll_s": QUOTES_POLL_S})


def _pacing(tenant: Tenant, tick: SpendTick, now: datetime) -> dict[str, Any]:
    """The budget window (or, with no budget that resets, this month) and the cumulative spend
    in it, for the pacing chart: the ideal line goes from 0 at the start to the limit at the
    reset."""
    budget = tick["budget"]
    if budget is not None and budget["resets_at"] is not None:
        start = datetime.fromtimestamp(budget["window_start"], tz=UTC)
        end = datetime.fromtimestamp(budget["resets_at"], tz=UTC)
        limit = budget["limit"]
        period = budget["period"]
    else:
        window = window_for(period="month", now=now)
        start, end, limit, period = window.start, window.end, None, "month"
    bucket = "minute" if (end - start) <= timedelta(days=1) else "hour"
    points = spend_cumulative(tenant=tenant, start=start, until=now, bucket=bucket)
    return {
        "period": period,
        "start": start.timestamp(),
        "end": end.timestamp(),
        "limit": limit,
        "points": [[p.at.timestamp(), money_str(p.cumulative)] for p in points],
    }


def _autobidder(auto: Autobidder | None, tenant: Tenant, now: datetime) -> dict[str, Any]:
    """The autobidder card's data: its multiplier and, per pacing step of the last
    ``AUTOBID_LOOKBACK``, [time, mu, dollars its budget had paid in its window] (the spend
    path), with the budget and its window for the even pace (from 0 at the window's start to
    the budget at its end)."""
    window = window_for(period=auto.period, now=now) if auto else None
    return {
        "enabled": bool(auto and auto.enabled),
        "mu": auto.mu if auto else None,
        "budget": money_str(auto.budget) if auto else None,
        "period": auto.period if auto else None,
        "start": window.start.timestamp() if window else None,
        "end": window.end.timestamp() if window else None,
        "steps": [
            [at.timestamp(), mu, money_str(spent)]
            for at, mu, spent in autobidder_steps(tenant=tenant, since=now - AUTOBID_LOOKBACK)
        ],
    }


@require_GET
@tenant_page
def tenant_dashboard(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    now = timezone.now()
    tick = spend_tick(tenant=tenant, now=now)
    autobidder = Autobidder.objects.filter(tenant=tenant).first()
    initial = {
        "tenant": tenant.slug,
        "socket": f"/ws/tenants/{tenant.slug}/",
        "now": now.timestamp(),
        "tick": tick,
        "pacing": _pacing(tenant, tick, now),
        "latency": [
            {
                "id": p.request_id,
                "t": p.at.timestamp(),
                "cls": p.request_class,
                "ttft": p.ttft_s,
                "e2e": p.e2e_s,
            }
            for p in latency_points(tenant=tenant, since=now - LATENCY_LOOKBACK)
        ],
        "autobidder": _autobidder(autobidder, tenant, now),
        "requests": [request_row(w) for w in requests_why(tenant=tenant, limit=RECENT_REQUESTS)],
        "quotes": {
            "url": reverse("dashboard:tenant_quotes", args=[tenant.slug]),
            "poll_s": QUOTES_POLL_S,
            "markets": _quote_curves(),
        },
    }
    context = {
        "tenant": tenant,
        "role": role_for_user(user=request.user, tenant=tenant),
        "may_manage": can_manage_keys(user=request.user, tenant=tenant),
        "autobidder": autobidder,
        "autobid_step": autobidder.steps.order_by("-at").first() if autobidder else None,
        "invoices": invoices_for_tenant(tenant=tenant)[:INVOICES_SHOWN],
        "keys": api_keys_for_tenant(tenant=tenant)[:10],
        "batches": batches_for_tenant(tenant=tenant)[:BATCHES_SHOWN],
        "may_submit_batches": can_submit_batches(user=request.user, tenant=tenant),
        "batch_form": BatchUploadForm(tenant=tenant),
        "initial": initial,
    }
    return render(request, "accounts/tenant_dashboard.html", context)
