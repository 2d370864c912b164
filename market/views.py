"""The operator console (staff only): a market's live order book, reserve, policy, engine,
revenue and welfare, and the tenants' spend. Thin: reads in selectors, writes in services.

Anonymous visitors are sent to the login page; logged-in users who are not staff get 403.
The live parts arrive over ``/ws/markets/<slug>/`` (``market.consumers.MarketConsumer``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from accounts.models import Tenant
from accounts.money import money_str
from market.live.book import book_snapshot
from market.live.engine_status import engine_chart, engine_status_last
from market.live.spend import tenant_spend_now
from market.mechanism import POLICIES
from market.models import Market
from market.selectors import (
    market_by_slug,
    markets_active,
    reserve_changes_for_market,
    revenue_per_minute,
)
from market.services import market_policy_set, market_reserve_set
from market.templatetags.units import rate

View = Callable[..., HttpResponse]
REVENUE_MINUTES = 60
TENANTS_SHOWN = 100


def staff_required(view: View) -> View:
    """Log in first (redirect), then staff only (403)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not (request.user.is_active and request.user.is_staff):
            raise PermissionDenied("The console is for operators.")
        return view(request, *args, **kwargs)

    return wrapper


def _market_or_404(slug: str) -> Market:
    try:
        return market_by_slug(slug=slug)
    except Market.DoesNotExist:
        raise Http404("No such market") from None


@require_GET
@staff_required
def console_index(request: HttpRequest) -> HttpResponse:
    """The markets; with exactly one open, its console directly."""
    markets = list(markets_active())
    if len(markets) == 1:
        return redirect("market:console", slug=markets[0].slug)
    return render(request, "market/console_index.html", {"markets": markets})


def _initial(market: Market) -> dict[str, Any]:
    """What the page shows before its socket speaks (the same payload shapes)."""
    revenue = [
        {
            "t": m.minute.timestamp(),
            "priority": float(m.priority),
            "tokens": float(m.tokens),
            "welfare": m.welfare,
            "requests": m.requests,
        }
        for m in revenue_per_minute(market=market, minutes=REVENUE_MINUTES)
    ]
    tenants = [tenant_spend_now(tenant=t) for t in Tenant.objects.order_by("name")[:TENANTS_SHOWN]]
    return {
        "market": market.slug,
        "socket": f"/ws/markets/{market.slug}/",
        "book": book_snapshot(market.slug),
        "engine": engine_status_last(market.slug),
        "engine_chart": engine_chart(market.slug),
        "revenue": revenue,
        "tenants": tenants,
        "reserve": money_str(market.reserve),
        "policy": market.policy,
    }


@require_GET
@staff_required
def console(request: HttpRequest, slug: str) -> HttpResponse:
    """One market's console."""
    market = _market_or_404(slug)
    context = {
        "market": market,
        "markets": markets_active(),
        "policies": POLICIES,
        "reserve_changes": reserve_changes_for_market(market=market, limit=20),
        "initial": _initial(market),
    }
    return render(request, "market/console.html", context)


@require_POST
@staff_required
def reserve_set(request: HttpRequest, slug: str) -> HttpResponse:
    """Set the reserve ($/s) from the console's form; audited by the service."""
    market = _market_or_404(slug)
    raw = (request.POST.get("reserve") or "").strip()
    old = market.reserve
    try:
        change = market_reserve_set(market=market, reserve=raw, user=request.user)
    except ValueError:
        messages.error(
            request,
            f"Reserve not changed: {raw!r} is not an amount in $/s (0 to 1000000, at most "
            "9 decimals).",
        )
    else:
        if change is None:
            messages.info(request, f"The reserve already is {rate(old)} $/s.")
        else:
            messages.success(
                request,
                f"Reserve {rate(change.old)} → {rate(change.new)} $/s; the engine "
                "applies it from its next round.",
            )
    return redirect(reverse("market:console", kwargs={"slug": market.slug}) + "#controls")


@require_POST
@staff_required
def policy_set(request: HttpRequest, slug: str) -> HttpResponse:
    """Switch the market's ordering policy."""
    market = _market_or_404(slug)
    policy = (request.POST.get("policy") or "").strip()
    try:
        old = market_policy_set(market=market, policy=policy, user=request.user)
    except ValueError:
        messages.error(request, f"Policy not changed: {policy!r} is not a policy.")
    else:
        if old is None:
            messages.info(request, f"The policy already is {policy}.")
        else:
            messages.success(
                request, f"Policy {old} → {policy}; the engine applies it from its next round."
            )
    return redirect(reverse("market:console", kwargs={"slug": market.slug}) + "#controls")
