"""Reads of the gateway: which market serves a model, which models are served, the budgets a
key's requests must fit.

Lookups on the hot path are cached in the process for a few seconds (``GATEWAY_MARKET_CACHE_S``,
default 2): a reserve or price change reaches the gateway within that time. Every ledger amount
is computed from the database's row at settlement, never from this cache.

A cache keyed by what a client sends must not grow with what clients send: only markets found
are cached (an unknown model name is looked up again, and kept nowhere), names are at most
``validation.MAX_MODEL_CHARS`` long, and every :class:`TtlCache` holds at most ``max_entries``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any, Generic, TypeVar

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from accounts.models import ApiKey
from accounts.money import ZERO, money, money_str
from accounts.selectors import budget_statuses_for_key, tenant_month_spend
from market.live.book import book_queue_len
from market.models import Market
from market.selectors import quote_history
from mechanism import DFS_AUCTIONS
from mechanism.aging import DEFAULT_DENSITY, DEFAULT_STEPS, AgeCredit
from mechanism.quotes import WINDOW_S, BidGroup, Waited, bid_groups, queue_scaled, quote, waits_for
from mechanism.requests import effective_bid
from mechanism.wait_bound import ranks_as

K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """A small thread-safe map whose entries expire ``ttl_s`` seconds after they were stored,
    holding at most ``max_entries``: storing one more drops the least recently used."""

    def __init__(self, *, ttl_s: Callable[[], float], max_entries: int = 1_000) -> None:
        self._ttl_s = ttl_s
        self._max = max_entries
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> tuple[bool, V | None]:
        """(found, value); an expired entry is not found (and is dropped)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return False, None
            if entry[0] < time.monotonic():
                del self._entries[key]
                return False, None
            self._entries.move_to_end(key)
            return True, entry[1]

    def put(self, key: K, value: V) -> None:
        ttl = self._ttl_s()
        if ttl <= 0:
            return
        with self._lock:
            self._entries[key] = (time.monotonic() + ttl, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_markets: TtlCache[str, Market] = TtlCache(ttl_s=lambda: settings.GATEWAY_MARKET_CACHE_S)


def market_for_model(*, model: str) -> Market | None:
    """The active market whose ``served_model`` (or else slug) is ``model``; None if none
    (not cached: a miss is looked up again, so unknown names take no memory)."""
    market = market_cached(model=model)
    if market is not None:
        return market
    candidates = list(
        Market.objects.filter(Q(served_model=model) | Q(slug=model), is_active=True).order_by(
            "slug"
        )[:10]
    )
    market = next((m for m in candidates if m.served_model == model), None)
    if market is None and candidates:
        market = candidates[0]
    if market is not None:
        _markets.put(model, market)
    return market


def market_cached(*, model: str) -> Market | None:
    """The market for ``model`` when this process's cache holds it (no database read)."""
    found, market = _markets.get(model)
    return market if found else None


def models_served() -> list[dict[str, Any]]:
    """``GET /v1/models``: one entry per active market, in OpenAI's model shape."""
    return [
        {
            "id": market.served_model,
            "object": "model",
            "created": int(market.created_at.timestamp()),
            "owned_by": "inference-market",
            "market": market.slug,
        }
        for market in Market.objects.filter(is_active=True).order_by("slug")
    ]


def budgets_for_key(*, api_key: ApiKey, now: datetime | None = None) -> dict[str, Any]:
    """``GET /v1/budgets``: the budgets ``api_key``'s requests must fit (its tenant's, then its
    own; never another key's), as a list in OpenAI's shape, each the budget payload of the
    tenant JSON API (``BudgetStatus.as_json``), and its tenant's month (UTC calendar month)
    whether or not a budget applies. Dollars as exact strings (9 places), times ISO 8601 UTC,
    ``seconds_until_reset`` in seconds (null, with ``resets_at``, for period "none")."""
    now = now or timezone.now()
    month = tenant_month_spend(tenant=api_key.tenant, now=now)
    return {
        "object": "list",
        "data": [
            {"object": "budget", **status.as_json(), "currency": "usd"}
            for status in budget_statuses_for_key(api_key=api_key, now=now)
        ],
        "tenant": {
            "month_start": month.window.start.isoformat(),
            "spent_this_month": money_str(month.spent),
            "held": money_str(month.held),
        },
    }


def quote_waits(*, market: Market) -> list[Waited]:
    """What every quote of ``market`` reads: its recent requests' bids and waits
    (``market.selectors.quote_history``), each wait scaled to the queue of its live book now
    (``mechanism.quotes.queue_scaled``; as read when no book has come)."""
    return queue_scaled(quote_history(market=market), waiting=book_queue_len(market.slug))


def wait_bound_credit(market: Market) -> AgeCredit | None:
    """The age credit ``market``'s engines give waiting requests (``mechanism.aging``): its
    wait bound in force with the engines' steps and density; None when the bound is off or its
    policy takes no credit (not a DFS auction)."""
    if not market.wait_bound_s or market.policy not in DFS_AUCTIONS:
        return None
    return AgeCredit(market.wait_bound_s, DEFAULT_DENSITY, DEFAULT_STEPS)


def quote_for(
    *,
    market: Market,
    ttft_s: float | None,
    probability: float,
    bid: Decimal | None,
    prompt_tokens: int | None = None,
) -> dict[str, Any]:
    """``GET /v1/quotes``: from the waits of ``market``'s recent requests, scaled to its queue
    now (``quote_waits``), the bid that buys a first token within ``ttft_s`` seconds
    with ``probability`` (null, with the reason, when no recent bid bought it), and the waits
    ``bid`` buys; the wait bound in force and, for a bid with its ``prompt_tokens``, what it
    ranks as once it has waited the bound and the waits of the bids it then ranks among.
    Dollars per second as exact strings, waits in seconds."""
    history = quote_waits(market=market)
    groups = bid_groups(history)
    credit = wait_bound_credit(market)
    body: dict[str, Any] = {
        "object": "quote",
        "model": market.served_model,
        "reserve": money_str(market.reserve),
        "based_on": {"requests": len(history), "window_s": WINDOW_S},
        "wait_bound": None
        if credit is None
        else {
            "wait_s": credit.wait_s,
            "source": market.wait_bound_mode,
            "steps": credit.steps,
            "credit_per_1k_prompt_tokens": money_str(money(Decimal(repr(credit.density)) * 1000)),
        },
    }
    quoted = None
    if ttft_s is not None:
        quoted = _target_bid(groups, market, ttft_s, probability) if groups else None
        body["target"] = {"ttft_s": ttft_s, "probability": probability}
        body["bid"] = None if quoted is None else money_str(quoted)
    reason = _unquoted_reason(len(history), groups, ttft_s, probability, quoted)
    if reason is not None:
        body["reason"] = reason
    if bid is not None:
        group = waits_for(groups, float(bid))
        body["waits"] = None if group is None else {"bid": money_str(bid), **_group_body(group)}
        if group is not None and credit is not None and prompt_tokens is not None:
            effective = float(effective_bid(bid, market.reserve, zero=ZERO))
            ranked = ranks_as(
                effective, prompt_tokens=prompt_tokens, waited_s=credit.wait_s, credit=credit
            )
            among = waits_for(groups, ranked)
            assert among is not None  # there are groups: the bid's own was found
            body["waits"]["at_bound"] = {
                "after_s": credit.wait_s,
                "prompt_tokens": prompt_tokens,
                "ranks_as": money_str(money(Decimal(repr(ranked)))),
                **_group_body(among),
            }
    return body


def _unquoted_reason(
    requests: int,
    groups: list[BidGroup],
    ttft_s: float | None,
    probability: float,
    quoted: Decimal | None,
) -> str | None:
    """Why no bid is quoted (None when one is, or none was asked for with groups to read): the
    answer's ``reason``, which the dashboard shows as it is."""
    if not groups:
        return f"too few requests served in the last {WINDOW_S:g} s to quote ({requests})"
    if ttft_s is not None and quoted is None:
        return (
            f"no recent bid was served within {ttft_s:g} s {probability:.0%} of the time "
            "by a margin clear of chance"
        )
    return None


def _group_body(group: BidGroup) -> dict[str, Any]:
    """A group of neighbouring recent bids as the answers show it: its bids' range ($/s, exact
    strings), its requests and its waits' quantiles (seconds to the first token)."""
    return {
        "bids_from": money_str(Decimal(repr(group.low))),
        "bids_to": money_str(Decimal(repr(group.high))),
        "requests": len(group.waits),
        **{f"ttft_p{round(q * 100)}_s": group.quantile(q) for q in (0.5, 0.9, 0.99)},
    }


# A market's bid -> wait curve, kept this many seconds: every open dashboard asks for it.
CURVE_TTL_S = 5.0
_curves: TtlCache[int, dict[str, Any]] = TtlCache(ttl_s=lambda: CURVE_TTL_S)


def quote_curve(*, market: Market) -> dict[str, Any]:
    """What each bid bought lately at ``market``, for the tenant dashboard's bid -> time to
    first token chart: the groups of neighbouring bids that ``GET /v1/quotes`` reads
    (``mechanism.quotes.bid_groups``), lowest bids first, each with its median bid and waits,
    and the quote for the market's priority target (``priority_quote``'s rule) or why there is
    none (the ``reason`` of ``GET /v1/quotes``, which the page shows as it is). The book stays
    anonymous: only bids and waits. Kept ``CURVE_TTL_S`` seconds."""
    found, curve = _curves.get(market.pk)
    if found:
        return curve
    history = quote_waits(market=market)
    groups = bid_groups(history)
    target = (
        _target_bid(groups, market, market.priority_ttft_s, market.priority_probability)
        if groups
        else None
    )
    curve = {
        "market": market.slug,
        "model": market.served_model,
        "reserve": money_str(market.reserve),
        "based_on": {"requests": len(history), "window_s": WINDOW_S},
        "groups": [
            {"median_bid": money_str(Decimal(repr(g.median_bid))), **_group_body(g)}
            for g in reversed(groups)
        ],
        "target": {
            "ttft_s": market.priority_ttft_s,
            "probability": market.priority_probability,
            "bid": None if target is None else money_str(target),
        },
        "reason": _unquoted_reason(
            len(history), groups, market.priority_ttft_s, market.priority_probability, target
        ),
    }
    _curves.put(market.pk, curve)
    return curve


# A market's quote for a target (its priority target, an autobidder class's), kept this many
# seconds: reading the history takes one query of up to quotes.HISTORY_MAX rows, too much for
# every request of tier "priority" or of a class with a latency target.
PRIORITY_QUOTE_TTL_S = 5.0
_priority_quotes: TtlCache[tuple[int, float, float], Decimal | None] = TtlCache(
    ttl_s=lambda: PRIORITY_QUOTE_TTL_S
)


def priority_quote(*, market: Market) -> Decimal | None:
    """The bid quoted now for ``market``'s priority target (a first token within
    ``priority_ttft_s`` seconds ``priority_probability`` of the time); None when none is."""
    return target_quote(
        market=market, ttft_s=market.priority_ttft_s, probability=market.priority_probability
    )


def target_quote(*, market: Market, ttft_s: float, probability: float) -> Decimal | None:
    """The bid quoted now for a first token within ``ttft_s`` seconds with ``probability`` at
    ``market`` (the priority tier's target, or an autobidder class's), as a tenant would bid it;
    None when none is. Kept ``PRIORITY_QUOTE_TTL_S`` seconds per target."""
    key = (market.pk, ttft_s, probability)
    found, quoted = _priority_quotes.get(key)
    if found:
        return quoted
    quoted = _target_bid(bid_groups(quote_waits(market=market)), market, ttft_s, probability)
    _priority_quotes.put(key, quoted)
    return quoted


def _target_bid(
    groups: list[BidGroup], market: Market, ttft_s: float, probability: float
) -> Decimal | None:
    """The quote from ``groups`` for a first token within ``ttft_s`` seconds with
    ``probability``, as a tenant sends it: 0, or at least the reserve (below it buys nothing)."""
    bid = quote(groups, ttft_s=ttft_s, p=probability)
    if bid is None:
        return None
    amount = Decimal(repr(bid))
    return amount if amount == 0 else max(amount, market.reserve)


def caches_clear() -> None:
    """Forget cached markets and quotes (tests; an operator's change that must apply at once)."""
    _markets.clear()
    _priority_quotes.clear()
    _curves.clear()
