"""Requests and their settlement into the ledger (docs/mechanism.md, "Rounds and charging";
docs/ledger.md, "The money rules").

A request's money moves like a two-phase transfer: :func:`request_open` (the gateway holds what
the request is likely to cost), then exactly one of :func:`request_settle` (served: its token
charge and the priority charge its engine reported, written together, the hold closed) or
:func:`request_fail` (not served: the hold is released, nothing charged). Each charge is one
ledger entry, unique per (request, kind), and a request settles once: a replay changes nothing.
The entries, the hold and the budget counters commit together, with the request's row locked
first. Round records never move money: they feed the order books and the consoles.

The writes are the ledger store's (``accounts.ledger``: one PostgreSQL statement each), with
typed results (``Settled``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from accounts.ledger import (
    Open,
    Outcome,
    PriorityCharge,
    Settled,
    Statement,
    ToSettle,
    Usage,
    ledger_store,
)
from accounts.models import ApiKey, ChargeKind, LedgerEntry, Request, RequestStatus, Tenant
from accounts.money import ZERO, PostedPrices, money, per_million
from accounts.services.budgets import hold_amount_checked

logger = logging.getLogger(__name__)


class UnknownRequest(LookupError):
    """No request with this id was opened through the gateway."""


@dataclass(frozen=True)
class Opening:
    """A request the gateway is about to forward (:func:`requests_open`): its hold of
    ``hold_amount`` dollars and its row. ``bid`` is in dollars per second of waiting.
    ``priority_cap`` (dollars) bounds the priority charge settled for it later: what the tenant
    consented to, which may exceed the hold (the settlement rule keeps the budgets whole
    whatever the hold); None leaves it uncapped. ``gateway``: the instance id of the gateway
    process that holds it (``accounts.services.gateways``), written in the same row."""

    request_id: str
    tenant: Tenant
    api_key: ApiKey | None
    market: PostedPrices
    bid: Decimal | float | str
    hold_amount: Decimal | float | str
    request_class: str = "interactive"
    bid_source: str = "none"
    priority_cap: Decimal | None = None
    gateway: str = ""


def request_open(
    *,
    request_id: str,
    tenant: Tenant,
    api_key: ApiKey | None,
    market: PostedPrices,
    bid: Decimal | float | str,
    hold_amount: Decimal | float | str,
    request_class: str = "interactive",
    bid_source: str = "none",
    priority_cap: Decimal | None = None,
    gateway: str = "",
    now: datetime | None = None,
) -> Request:
    """Record a request the gateway is about to forward, and hold ``hold_amount`` dollars
    (:class:`Opening` says what each argument is). Raises ``BudgetExhausted`` (nothing
    written) when the hold does not fit. Idempotent per ``request_id``."""
    opening = Opening(
        request_id, tenant, api_key, market, bid, hold_amount, request_class, bid_source,
        priority_cap, gateway,
    )  # fmt: skip
    (opened,) = requests_open(openings=[opening], now=now)
    if isinstance(opened, Exception):
        raise opened
    return opened


def requests_open(
    *, openings: Sequence[Opening], now: datetime | None = None
) -> list[Request | Exception]:
    """:func:`request_open` for many requests at once, as if one after another in the order
    of ``openings``, in one statement of the ledger store when each fits: each one's row, or
    the exception :func:`request_open` raises for it (BudgetExhausted, ValueError), in the
    order of ``openings``."""
    now = now or timezone.now()
    results, opens, where = _opens(openings)
    for k, opened in zip(where, ledger_store().requests_open(opens=opens, now=now), strict=True):
        results[k] = opened
    return [r for r in results if r is not None]


def requests_open_first(
    *, openings: Sequence[Opening], now: datetime
) -> Statement[list[Request | Exception | None]]:
    """The first statement of :func:`requests_open`, to run on any connection (in a transaction
    of its own): for each opening, its row or its exception where the statement (or the checks
    before it) decided it, None where :func:`requests_open` of those, in their order, is to
    decide it (the statement wrote nothing for them)."""
    results, opens, where = _opens(openings)
    first = ledger_store().requests_open_first(opens=opens, now=now)

    def read(rows: list[tuple[Any, ...]]) -> list[Request | Exception | None]:
        decided = list(results)
        for k, opened in zip(where, first.read(rows), strict=True):
            decided[k] = opened
        return decided

    return Statement(first.sql, first.params, read)


def _opens(
    openings: Sequence[Opening],
) -> tuple[list[Request | Exception | None], list[Open], list[int]]:
    """The openings checked: each one's exception where a check refused it (else None), the
    ledger's opens of the others, and where each of those is in ``openings``."""
    results: list[Request | Exception | None] = [None] * len(openings)
    opens: list[Open] = []
    where: list[int] = []
    for k, o in enumerate(openings):
        try:
            amount = hold_amount_checked(tenant=o.tenant, api_key=o.api_key, amount=o.hold_amount)
            if o.priority_cap is not None and Decimal(o.priority_cap) < ZERO:
                raise ValueError(f"priority_cap {o.priority_cap} must not be negative")
        except ValueError as exc:
            results[k] = exc
            continue
        fields = {
            "market_id": o.market.pk,
            "bid": money(o.bid),
            "request_class": o.request_class,
            "bid_source": o.bid_source,
            "priority_cap": None if o.priority_cap is None else money(o.priority_cap),
            "gateway": o.gateway,
        }
        opens.append(Open(o.tenant, o.api_key, o.request_id, amount, fields))
        where.append(k)
    return results, opens, where


def request_fail(*, request_id: str, now: datetime | None = None) -> bool:
    """Mark a request that was not served as failed and release its hold (no charge).

    Returns whether the request was still queued. A failed request is never charged later,
    even if a round record admitting it arrives afterwards.
    """
    return ledger_store().hold_close(
        request_id=request_id, now=now or timezone.now(), fail_request=True
    )


def token_charge(*, market: PostedPrices, usage: Usage) -> Decimal:
    """Dollars for a request's tokens at ``market``'s posted prices (per million tokens):
    uncached prompt tokens at the input price, cached ones at the cached price, completion
    tokens at the output price. Rounded once, by :func:`accounts.money.money`."""
    for name, value in usage.tokens_detail().items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int: {value!r}")
    if usage.cached_tokens > usage.prompt_tokens:
        raise ValueError(
            f"cached_tokens ({usage.cached_tokens}) > prompt_tokens ({usage.prompt_tokens})"
        )
    uncached = usage.prompt_tokens - usage.cached_tokens
    exact = (
        per_million(tokens=uncached, price_per_million=market.price_input_per_mtok)
        + per_million(
            tokens=usage.cached_tokens, price_per_million=market.price_cached_input_per_mtok
        )
        + per_million(
            tokens=usage.completion_tokens, price_per_million=market.price_output_per_mtok
        )
    )
    return money(exact)


@dataclass(frozen=True)
class Served:
    """A served request to settle (:func:`requests_settle`): what it used, as its engine
    reported it, the priority charge its engine reported (None: none), and its market as the
    caller read it (None: read its prices first)."""

    request_id: str
    usage: Usage
    priority: PriorityCharge | None = None
    market: PostedPrices | None = None


def request_settle(
    *,
    request_id: str,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    ttft_s: float | None = None,
    e2e_s: float | None = None,
    priority: PriorityCharge | None = None,
    now: datetime | None = None,
    market: PostedPrices | None = None,
) -> Settled:
    """Settle a served request: charge its tokens at the posted prices and the ``priority``
    charge its engine reported (None: none reported), close its hold, once. ``prompt_tokens``
    counts all prompt tokens, ``cached_tokens`` those of them that were cached; the latencies
    (seconds), when known, are kept on the request for the dashboards.

    A replay returns the entries written the first time (``Outcome.DUPLICATE``).
    UnknownRequest when no such request was opened; ValueError when it had failed (a failed
    request is never charged) or the counts are not counts (negative, more cached tokens than
    prompt tokens).

    The token charge is at the prices of the market's row when it is written. ``market``, the
    request's market as the caller read it, saves reading them first when they are still the
    same (the settlement is then one statement).
    """
    usage = Usage(prompt_tokens, cached_tokens, completion_tokens, ttft_s, e2e_s)
    served = Served(request_id, usage, priority, market)
    result = requests_settle(served=[served], now=now)[0]
    if isinstance(result, Exception):
        raise result
    return result


def requests_settle(
    *, served: Sequence[Served], now: datetime | None = None
) -> list[Settled | Exception]:
    """:func:`request_settle` for many requests at once, as if one after another in the order
    of ``served``, in one statement of the ledger store when no budget cuts one of them: each
    one's result, or the exception :func:`request_settle` raises for it (UnknownRequest,
    ValueError), in the order of ``served``."""
    now = now or timezone.now()
    store = ledger_store()
    results: list[Settled | Exception | None] = [None] * len(served)
    prices: list[PostedPrices | None] = [s.market for s in served]
    pending = list(range(len(served)))
    while pending:  # until each is written at the prices it was priced from
        asks: list[tuple[int, ToSettle]] = []
        for k in pending:
            one = served[k]
            if prices[k] is None:
                prices[k] = store.posted_prices(request_id=one.request_id)
            price = prices[k]
            if price is None:
                results[k] = UnknownRequest(f"no request {one.request_id!r}")
                continue
            ask = _to_settle(one, price)
            if isinstance(ask, ValueError):
                results[k] = ask
            else:
                asks.append((k, ask))
        settled = store.requests_settle(asks=[ask for _, ask in asks], now=now)
        pending = []
        for (k, _), result in zip(asks, settled, strict=True):
            results[k] = _settled_result(served[k].request_id, result)
            if result.outcome == Outcome.REPRICED:
                prices[k] = None  # the market's prices changed since they were read: again
                pending.append(k)
    return [r for r in results if r is not None]


def requests_settle_first(
    *, served: Sequence[Served], now: datetime
) -> Statement[list[Settled | Exception | None]]:
    """The first statement of :func:`requests_settle`, to run on any connection (in a
    transaction of its own): for each request, its result or its exception where the statement
    (or the checks before it) decided it: written, or not to be charged (unknown, failed);
    None where :func:`requests_settle` of those, in their order, is to decide it (a replay, new
    prices, prices not given, a budget's cut before it, counter rows missing). The statement
    wrote nothing for those, and settling is idempotent."""
    results: list[Settled | Exception | None] = [None] * len(served)
    asks: list[tuple[int, ToSettle]] = []
    for k, one in enumerate(served):
        if one.market is not None:
            ask = _to_settle(one, one.market)
            if isinstance(ask, ValueError):
                results[k] = ask
            else:
                asks.append((k, ask))
    first = ledger_store().requests_settle_first(asks=[ask for _, ask in asks], now=now)

    def read(rows: list[tuple[Any, ...]]) -> list[Settled | Exception | None]:
        decided = list(results)
        for (k, _), settled in zip(asks, first.read(rows), strict=True):
            if settled is not None and settled.outcome in _DECIDED_FIRST:
                decided[k] = _settled_result(served[k].request_id, settled)
        return decided

    return Statement(first.sql, first.params, read)


# What the first statement decides alone: the others read the ledger again (a replay's
# entries) or price the request again.
_DECIDED_FIRST = frozenset({Outcome.WRITTEN, Outcome.UNKNOWN, Outcome.NOT_SERVED})


def _to_settle(one: Served, price: PostedPrices) -> ToSettle | ValueError:
    """The ledger's ask to settle ``one`` at ``price``, or why its counts cannot be charged."""
    try:
        tokens = token_charge(market=price, usage=one.usage)
    except ValueError as exc:
        return exc
    return ToSettle(one.request_id, one.usage, tokens, one.priority, price)


def _settled_result(request_id: str, settled: Settled) -> Settled | Exception:
    """A settlement's result as :func:`request_settle` returns (or raises) it."""
    if settled.outcome == Outcome.UNKNOWN:
        return UnknownRequest(f"no request {request_id!r}")
    if settled.outcome == Outcome.NOT_SERVED:
        return ValueError(f"request {request_id!r} failed: it is not charged")
    if settled.outcome == Outcome.DUPLICATE:
        entries = {e.kind: e for e in LedgerEntry.objects.filter(request_id=request_id)}
        return Settled(
            Outcome.DUPLICATE, entries.get(ChargeKind.TOKENS), entries.get(ChargeKind.PRIORITY)
        )
    return settled


@dataclass(frozen=True)
class SweepResult:
    """What a sweep (:func:`holds_sweep`, :func:`gateways_lost_sweep`) did, counted in
    requests."""

    failed: int = 0  # failed uncharged, their holds released


def holds_sweep(*, stale_after_s: float, now: datetime | None = None) -> SweepResult:
    """Close what a lost gateway left open, so that no hold reserves a budget for ever: a
    request still queued ``stale_after_s`` seconds after it was opened (a client waits minutes
    at most) fails, uncharged, its hold released. Idempotent and safe beside live settlement
    (the same locked writes: a request settled meanwhile stays served). The last resort:
    :func:`gateways_lost_sweep` closes those of a gateway known gone much sooner."""
    now = now or timezone.now()
    stale = Request.objects.filter(
        status=RequestStatus.QUEUED, created_at__lt=now - timedelta(seconds=stale_after_s)
    )
    failed = _queued_failed(stale, now=now)
    if failed:
        logger.info("holds sweep: %d stale requests failed", failed)
    return SweepResult(failed=failed)


def gateways_lost_sweep(*, gateways: Sequence[str], now: datetime | None = None) -> SweepResult:
    """Fail, uncharged, the requests still queued that the gateway processes ``gateways`` (their
    instance ids) admitted, their holds released: those processes are gone (killed, or stopped
    without finishing them), so nothing will ever settle them. The same writes as
    :func:`holds_sweep`."""
    if not gateways:
        return SweepResult()
    now = now or timezone.now()
    lost = Request.objects.filter(status=RequestStatus.QUEUED, gateway__in=list(gateways))
    failed = _queued_failed(lost, now=now)
    if failed:
        logger.warning(
            "holds sweep: %d requests of %d lost gateway processes failed, uncharged",
            failed, len(gateways),
        )  # fmt: skip
    return SweepResult(failed=failed)


def _queued_failed(requests: QuerySet[Request], *, now: datetime) -> int:
    """Fail each of ``requests`` still queued (``request_fail``: its hold released, nothing
    charged; one locked write each, so one settled meanwhile stays served): how many."""
    failed = 0
    for request_id in requests.values_list("request_id", flat=True):
        failed += request_fail(request_id=request_id, now=now)
    return failed
