"""The operator console (staff only): a market's live order book, reserve, policy, engine,
revenue and welfare, and the tenants' spend. Thin: reads in selectors, writes in services.

Anonymous visitors are sent to the login page; logged-in users who are not staff get 403.
The live parts arrive over ``/ws/markets/<slug>/`` (``market.consumers.MarketConsumer``).

Controls that could hurt are applied in two steps (``market.controls``): a policy switch, and a
reserve far from the one in force, first come back as a question on the console (what the change
does, to the book waiting now for a reserve), and are applied when the operator confirms it (the
form posts ``confirmed`` with the same value).

A change refused (an amount above the ceiling, a bound out of range) is said where it was made:
the console comes back with that form in view, the refusal beside its field (announced to
screen readers, the field marked invalid and focused), with what was typed kept in the field, not
the value in force (``console_refusal_say``; the session carries it across the redirect, once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from decimal import Decimal
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from accounts.figures import figure
from accounts.models import Tenant
from accounts.money import money_exact, money_str
from market.controls import (
    RESERVE_CONFIRM_FACTOR,
    ReserveImpact,
    policy_description,
    reserve_needs_confirmation,
)
from market.live.book import book_reserve_impact, book_snapshot
from market.live.engine_status import engine_chart, engine_status_last
from market.live.spend import tenant_spend_now
from market.live.whatif import whatif_for_market
from market.models import Market
from market.selectors import (
    control_changes_for_market,
    market_by_slug,
    markets_active,
    reserve_changes_for_market,
    revenue_per_minute,
)
from market.services import (
    ReserveAboveCeiling,
    market_alerts_set,
    market_auto_reserve_set,
    market_policy_set,
    market_reserve_max_set,
    market_reserve_set,
    market_wait_bound_set,
)
from market.templatetags.units import rate
from mechanism import OFFERED, wait_bound
from mechanism.aging import WAIT_BOUND_HELP, WAIT_BOUND_MAX_S, WAIT_BOUND_MIN_S

View = Callable[..., HttpResponse]
REVENUE_MINUTES = 60
TENANTS_SHOWN = 100
REFUSAL_KEY = "console_refusal"  # the session's key for a refused change, read once
# Each control's form on the console (its id is "<control>-form").
CONTROL_FORMS = ("reserve", "auto-reserve", "policy", "wait-bound", "reserve-max", "alerts")


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


def console_control(view: Callable[[HttpRequest, Market], HttpResponse | None]) -> View:
    """A control posted from a market's console: POST, staff only; ``view`` gets the market and,
    unless it answers itself, the operator is sent back to the console's controls."""

    @require_POST
    @staff_required
    @wraps(view)
    def wrapper(request: HttpRequest, slug: str) -> HttpResponse:
        market = _market_or_404(slug)
        return view(request, market) or redirect(_console_url(market))

    return wrapper


def console_refusal_say(
    request: HttpRequest, market: Market, *, control: str, message: str, typed: dict[str, str]
) -> HttpResponse:
    """Refuse a change made on ``control``'s form: back to the console, ``message`` beside the
    form's field and ``typed`` (field name -> text as sent) kept in its fields."""
    assert control in CONTROL_FORMS, control
    request.session[REFUSAL_KEY] = {
        "market": market.slug, "control": control, "message": message, "typed": typed,
    }  # fmt: skip
    # No #fragment: a fragment's scroll takes the focus back from the field; the field's
    # autofocus brings it into view instead.
    return redirect(reverse("market:console", kwargs={"slug": market.slug}))


def _refusal(request: HttpRequest, market: Market) -> dict[str, Any] | None:
    """The refused change the last POST left for this console (once), if any."""
    refusal = request.session.pop(REFUSAL_KEY, None)
    if not isinstance(refusal, dict) or refusal.get("market") != market.slug:
        return None
    return refusal


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
        "auto_reserve": {"on": market.auto_reserve, "target_s": market.auto_reserve_target_s},
        "alerts": {"queue": market.alert_queue, "ttft_p99_s": market.alert_ttft_p99_s},
    }


def _confirmations(request: HttpRequest, market: Market) -> dict[str, Any]:
    """The question the console asks before applying a change (``?confirm_reserve=`` or
    ``?confirm_policy=``, where a POST sent it back), if it still stands."""
    asked: dict[str, Any] = {}
    raw = request.GET.get("confirm_reserve")
    if raw is not None:
        try:
            new = money_exact(raw.strip())
        except ValueError:
            new = None
        if new is not None and new <= market.reserve_max and new != market.reserve:
            asked["confirm_reserve"] = {
                "value": money_str(new),  # what the confirming form posts back
                "new": new,
                "old": market.reserve,
                "factor": _factor(market.reserve, new),
                "impact": _impact(market, new),
            }
    policy = request.GET.get("confirm_policy")
    if policy in OFFERED and policy != market.policy:
        asked["confirm_policy"] = {
            "new": policy,
            "old": market.policy,
            "new_description": policy_description(policy),
            "old_description": policy_description(market.policy),
        }
    return asked


def _impact(market: Market, reserve: Decimal) -> ReserveImpact | None:
    """What ``reserve`` would do to the market's book waiting now (None: no book yet)."""
    return book_reserve_impact(market.slug, reserve=float(reserve), current=float(market.reserve))


def _factor(old: Decimal, new: Decimal) -> str:
    """How far ``new`` is from ``old`` ($/s), in a sentence."""
    if old == 0:
        return "There is no reserve now: every bid buys priority."
    if new == 0:
        return f"That removes the reserve ({rate(old)} $/s now)."
    if new > old:
        return f"That is {figure(new / old)}× the reserve in force ({rate(old)} $/s)."
    return f"That is 1/{figure(old / new)} of the reserve in force ({rate(old)} $/s)."


@require_GET
@staff_required
def console(request: HttpRequest, slug: str) -> HttpResponse:
    """One market's console."""
    market = _market_or_404(slug)
    context = {
        "market": market,
        "markets": markets_active(),
        # What may be chosen, and the policy in force if it is no longer offered.
        "policies": [
            (p, policy_description(p))
            for p in (OFFERED if market.policy in OFFERED else (market.policy, *OFFERED))
        ],
        "policy_description": policy_description(market.policy),
        "reserve_changes": reserve_changes_for_market(market=market, limit=20),
        "control_changes": control_changes_for_market(market=market, limit=20),
        "confirm_factor": RESERVE_CONFIRM_FACTOR,
        "auto_reserve_interval_s": settings.AUTO_RESERVE_INTERVAL_S,
        "wait_bound_min_s": WAIT_BOUND_MIN_S,
        "wait_bound_max_s": WAIT_BOUND_MAX_S,
        "wait_bound_help": WAIT_BOUND_HELP,
        "wait_bound_said": wait_bound_said(market),
        "wait_bound_modes": Market.WaitBoundMode.choices,
        "wait_bound_rule": wait_bound.AUTO_HELP,
        "wait_bound_interval_s": settings.AUTO_RESERVE_INTERVAL_S,
        "initial": _initial(market),
        "refused": _refusal(request, market),
        **_confirmations(request, market),
    }
    return render(request, "market/console.html", context)


def _console_url(market: Market, **query: str) -> str:
    url = reverse("market:console", kwargs={"slug": market.slug})
    return (f"{url}?{urlencode(query)}" if query else url) + "#controls"


def _impact_json(impact: ReserveImpact | None) -> dict[str, Any] | None:
    if impact is None:
        return None
    priority = {"lose_priority": impact.lose_priority, "gain_priority": impact.gain_priority}
    return asdict(impact) | priority


@require_GET
@staff_required
def reserve_impact(request: HttpRequest, slug: str) -> JsonResponse:
    """What a reserve typed in the form would do, before it is applied: to the book waiting now,
    whether it must be confirmed, whether the ceiling refuses it. 400 for what is no amount."""
    market = _market_or_404(slug)
    raw = (request.GET.get("reserve") or "").strip()
    try:
        new = money_exact(raw)
    except ValueError:
        return JsonResponse({"error": f"{raw!r} is not an amount in $/s"}, status=400)
    return JsonResponse(
        {
            "reserve": money_str(new),
            "current": money_str(market.reserve),
            "ceiling": money_str(market.reserve_max),
            "above_ceiling": new > market.reserve_max,
            "confirm": reserve_needs_confirmation(market.reserve, new),
            "impact": _impact_json(_impact(market, new)),
        }
    )


@require_GET
@staff_required
def reserve_whatif(request: HttpRequest, slug: str) -> JsonResponse:
    """The reserve what-if (``market.live.whatif``): the market's recorded queues of the last
    hour cleared again at a range of reserves, around the reserve in force."""
    market = _market_or_404(slug)
    return JsonResponse(dict(whatif_for_market(market.slug, current=float(market.reserve))))


@console_control
def reserve_set(request: HttpRequest, market: Market) -> HttpResponse | None:
    """Set the reserve ($/s) from the console's form; audited by the service. A reserve beyond
    ``RESERVE_CONFIRM_FACTOR`` of the one in force comes back as a question first."""
    raw = (request.POST.get("reserve") or "").strip()
    old = market.reserve
    try:
        new = money_exact(raw)
        if new > market.reserve_max:
            raise ReserveAboveCeiling(new, market.reserve_max)
        confirmed = request.POST.get("confirmed")
        if reserve_needs_confirmation(old, new) and confirmed != money_str(new):
            return redirect(_console_url(market, confirm_reserve=money_str(new)))
        change = market_reserve_set(market=market, reserve=new, user=request.user)
    except ReserveAboveCeiling as exc:
        why = (
            f"Reserve not changed: {rate(exc.reserve)} $/s is above this market's ceiling of "
            f"{rate(exc.ceiling)} $/s. Raise the ceiling first if you mean it."
        )
        return console_refusal_say(
            request, market, control="reserve", message=why, typed={"reserve": raw}
        )
    except ValueError:
        why = (
            f"Reserve not changed: {raw!r} is not an amount in $/s (0 to 1000000, at most "
            "9 decimals)."
        )
        return console_refusal_say(
            request, market, control="reserve", message=why, typed={"reserve": raw}
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


@console_control
def reserve_max_set(request: HttpRequest, market: Market) -> HttpResponse | None:
    """Set the reserve's ceiling ($/s); audited by the service."""
    raw = (request.POST.get("reserve_max") or "").strip()
    try:
        change = market_reserve_max_set(market=market, reserve_max=raw, user=request.user)
    except ValueError as exc:
        why = f"Ceiling not changed: {_ceiling_refusal(raw, exc)}"
        return console_refusal_say(
            request, market, control="reserve-max", message=why, typed={"reserve_max": raw}
        )
    else:
        if change is None:
            messages.info(request, f"The ceiling already is {rate(market.reserve_max)} $/s.")
        else:
            messages.success(
                request,
                f"Reserve ceiling {rate(Decimal(change.old))} → {rate(Decimal(change.new))} $/s.",
            )


def _ceiling_refusal(raw: str, exc: ValueError) -> str:
    """Why a ceiling was refused, in the console's words."""
    if "below the reserve" in str(exc):
        return f"{raw} $/s is below the reserve in force; lower the reserve first."
    return f"{raw!r} is not an amount in $/s (0 to 1000000, at most 9 decimals)."


@console_control
def policy_set(request: HttpRequest, market: Market) -> HttpResponse | None:
    """Switch the market's ordering policy, once confirmed (a switch first comes back as a
    question saying what the new policy does); audited by the service."""
    policy = (request.POST.get("policy") or "").strip()
    if policy in OFFERED and policy != market.policy and request.POST.get("confirmed") != policy:
        return redirect(_console_url(market, confirm_policy=policy))
    try:
        old = market_policy_set(market=market, policy=policy, user=request.user)
    except ValueError as exc:
        return console_refusal_say(
            request, market, control="policy", message=f"Policy not changed: {exc}.",
            typed={"policy": policy},
        )  # fmt: skip
    else:
        if old is None:
            messages.info(request, f"The policy already is {policy}.")
        else:
            messages.success(
                request, f"Policy {old} → {policy}; the engine applies it from its next round."
            )


@console_control
def wait_bound_set(request: HttpRequest, market: Market) -> HttpResponse | None:
    """Choose where the market's wait bound comes from: ``mode`` auto, pinned (with
    ``wait_bound_s`` seconds) or off; audited by the service. Without a mode, a number pins the
    bound and 0 turns it off."""
    mode = (request.POST.get("mode") or "").strip() or None
    raw = (request.POST.get("wait_bound_s") or "").strip()
    value: float | None = None
    if mode in (None, wait_bound.PINNED):
        try:
            value = _seconds(raw)
        except ValueError:
            why = f"Wait bound not changed: {raw!r} is not a number of seconds."
            return console_refusal_say(
                request, market, control="wait-bound", message=why,
                typed={"wait_bound_s": raw, "mode": mode or ""},
            )  # fmt: skip
    try:
        change = market_wait_bound_set(
            market=market, wait_bound_s=value, mode=mode, user=request.user
        )
    except ValueError as exc:
        return console_refusal_say(
            request, market, control="wait-bound", message=f"Wait bound not changed: {exc}.",
            typed={"wait_bound_s": raw, "mode": mode or ""},
        )  # fmt: skip
    if change is None:
        messages.info(request, f"The wait bound already is {wait_bound_said(market)}.")
    elif market.wait_bound_mode == wait_bound.OFF:
        messages.success(request, "Wait bound off: bids alone order the queue again.")
    else:
        messages.success(
            request,
            f"Wait bound now {wait_bound_said(market)} (was {change.old}), from the engines' "
            "next round.",
        )
    return None


def wait_bound_said(market: Market) -> str:
    """The bound in force and where it came from, in the console's words."""
    if market.wait_bound_mode == wait_bound.OFF:
        return "off"
    if market.wait_bound_mode == wait_bound.AUTO:
        return f"{market.wait_bound_s:g} s, set automatically from the market's recent waits"
    return f"{market.wait_bound_s:g} s, pinned"


def _seconds(raw: str) -> float:
    """A number of seconds typed in a form (ValueError for anything else)."""
    value = float(raw)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(raw)
    return value


@console_control
def auto_reserve_set(request: HttpRequest, market: Market) -> HttpResponse | None:
    """Turn the automatic reserve on toward a target wait (seconds), or off; audited by the
    service."""
    enabled = request.POST.get("enabled") == "on"
    raw = (request.POST.get("target_s") or "").strip()
    try:
        target = _seconds(raw) if raw else None
        change = market_auto_reserve_set(
            market=market, enabled=enabled, target_s=target, user=request.user
        )
    except ValueError:
        why = f"Automatic reserve not changed: {raw!r} is not a number of seconds > 0."
        typed = {"target_s": raw, "enabled": "on" if enabled else ""}
        return console_refusal_say(
            request, market, control="auto-reserve", message=why, typed=typed
        )
    else:
        if change is None:
            messages.info(request, "The automatic reserve already is so.")
        elif enabled:
            messages.success(
                request,
                f"Automatic reserve on: it moves by at most 12.5% every "
                f"{settings.AUTO_RESERVE_INTERVAL_S:g} s toward a TTFT p90 of "
                f"{market.auto_reserve_target_s:g} s for the bids that buy priority.",
            )
        else:
            messages.success(request, "Automatic reserve off: the reserve stays where it is.")


@console_control
def alerts_set(request: HttpRequest, market: Market) -> HttpResponse | None:
    """Set the console's alert thresholds (blank: no alert); audited by the service."""
    raw_queue = (request.POST.get("alert_queue") or "").strip()
    raw_ttft = (request.POST.get("alert_ttft_p99_s") or "").strip()
    try:
        queue = int(raw_queue) if raw_queue else None
        ttft = _seconds(raw_ttft) if raw_ttft else None
        changes = market_alerts_set(market=market, queue=queue, ttft_p99_s=ttft, user=request.user)
    except ValueError:
        why = (
            f"Alerts not changed: the queue takes a whole number of requests >= 0 "
            f"({raw_queue!r}), the TTFT p99 a number of seconds > 0 ({raw_ttft!r}); blank for "
            "no alert."
        )
        typed = {"alert_queue": raw_queue, "alert_ttft_p99_s": raw_ttft}
        return console_refusal_say(request, market, control="alerts", message=why, typed=typed)
    else:
        if changes:
            messages.success(request, "Alert thresholds saved.")
        else:
            messages.info(request, "The alert thresholds already are so.")
