"""Requests and their settlement into the ledger (DESIGN.md 4.5 and 6).

A request's life: :func:`request_open` (the gateway holds its worst case), then either it is
admitted in a round (the round record's priority charge, :func:`round_record_settle`) and
completes (:func:`request_complete`, the token charge), or it fails (:func:`request_fail`, the
hold is released, nothing charged). Each charge is one ledger entry, unique per (request,
kind): replaying a round record or a completion report changes nothing. The entry, the hold it
consumes and the budget counters commit together, with the request's row locked first.

The writes are the ledger store's (``accounts.ledger``: one statement each on PostgreSQL, the
ORM elsewhere), with typed results (``Charged``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from accounts.ledger import Charged, Outcome, ledger_store
from accounts.models import (
    ApiKey,
    ChargeKind,
    Hold,
    HoldState,
    LedgerEntry,
    PriorityDetail,
    Request,
    RequestStatus,
    Tenant,
    TokensDetail,
)
from accounts.money import ZERO, PostedPrices, money, per_million
from accounts.services.budgets import hold_amount_checked, hold_release
from scheduler_bridge.contract.records import RoundRecord, round_record_checked

logger = logging.getLogger(__name__)


class UnknownRequest(LookupError):
    """No request with this id was opened through the gateway."""


@dataclass(frozen=True)
class SettleResult:
    """What settling one round record did, counted per admitted request."""

    charged: int = 0  # new priority entries written
    duplicates: int = 0  # already settled (a replayed record): nothing written
    unknown: int = 0  # no such request (or not in this record's market): skipped
    not_served: int = 0  # the request had already failed: never charged
    pending: int = 0  # still in flight: charged once it is served, never if it fails


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
    now: datetime | None = None,
) -> Request:
    """Record a request the gateway is about to forward, and hold ``hold_amount`` dollars.

    Raises ``BudgetExhausted`` (nothing written) when the hold does not fit. ``bid`` is in
    dollars per second of waiting. ``priority_cap`` (dollars, within the hold) bounds the
    priority charge settled for it later, so that the hold covers every charge it can get;
    None leaves it uncapped. Idempotent per ``request_id``.
    """
    now = now or timezone.now()
    amount = hold_amount_checked(tenant=tenant, api_key=api_key, amount=hold_amount)
    if priority_cap is not None and not ZERO <= Decimal(priority_cap) <= amount:
        raise ValueError(f"priority_cap {priority_cap} must lie between 0 and the hold ({amount})")
    fields = {
        "market_id": market.pk,
        "bid": money(bid),
        "request_class": request_class,
        "bid_source": bid_source,
        "priority_cap": None if priority_cap is None else money(priority_cap),
    }
    return ledger_store().request_open(
        tenant=tenant, api_key=api_key, request_id=request_id, amount=amount, now=now, fields=fields
    )


def request_fail(*, request_id: str, now: datetime | None = None) -> bool:
    """Mark a request that was not served as failed and release its hold (no charge).

    Returns whether the request was still queued. A failed request is never charged later,
    even if a round record admitting it arrives afterwards.
    """
    return ledger_store().hold_close(
        request_id=request_id, now=now or timezone.now(), fail_request=True
    )


# How round_record_settle counts each outcome of a priority charge (never REPRICED: unpriced).
_COUNTED = {
    Outcome.WRITTEN: "charged",
    Outcome.DUPLICATE: "duplicates",
    Outcome.UNKNOWN: "unknown",
    Outcome.NOT_SERVED: "not_served",
    Outcome.PENDING: "pending",
}


def round_record_settle(
    *, record: RoundRecord | dict[str, Any], now: datetime | None = None
) -> SettleResult:
    """Charge each request admitted in ``record`` its priority charge (dollars, from the engine).

    The record is checked first (ValueError if malformed). Unknown requests and requests of
    another market are counted and skipped, never charged; so are requests that already failed.
    """
    record = round_record_checked(record)
    now = now or timezone.now()
    counts = {"charged": 0, "duplicates": 0, "unknown": 0, "not_served": 0, "pending": 0}
    for adm in record["admitted"]:
        detail: PriorityDetail = {
            "bid": adm["bid"],
            "effective_bid": adm["effective_bid"],
            "time_saved_s": adm["time_saved_s"],
            "planned_completion_s": adm["planned_completion_s"],
            "position": adm["position"],
            "engine_charge": adm["charge"],
            "block": adm["block"],  # the subtree it waited in: "why this rank"
            "engine": record["engine"],  # which replica served it
        }
        charged = ledger_store().charge_write(
            request_id=adm["request_id"],
            kind=ChargeKind.PRIORITY,
            amount=money(adm["charge"]),
            round_id=record["round_id"],
            detail=detail,
            now=now,
            market_slug=record["market"],
        )
        outcome = charged.outcome
        if outcome == Outcome.UNKNOWN:
            logger.warning(
                "round %s admits unknown request %r", record["round_id"], adm["request_id"]
            )
        counts[_COUNTED[outcome]] += 1
    return SettleResult(**counts)


def token_charge(
    *, market: PostedPrices, prompt_tokens: int, cached_tokens: int, completion_tokens: int
) -> Decimal:
    """Dollars for a request's tokens at ``market``'s posted prices (per million tokens):
    uncached prompt tokens at the input price, cached ones at the cached price, completion
    tokens at the output price. Rounded once, by :func:`accounts.money.money`."""
    for name, value in [
        ("prompt_tokens", prompt_tokens),
        ("cached_tokens", cached_tokens),
        ("completion_tokens", completion_tokens),
    ]:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int: {value!r}")
    if cached_tokens > prompt_tokens:
        raise ValueError(f"cached_tokens ({cached_tokens}) > prompt_tokens ({prompt_tokens})")
    exact = (
        per_million(
            tokens=prompt_tokens - cached_tokens, price_per_million=market.price_input_per_mtok
        )
        + per_million(tokens=cached_tokens, price_per_million=market.price_cached_input_per_mtok)
        + per_million(tokens=completion_tokens, price_per_million=market.price_output_per_mtok)
    )
    return money(exact)


def request_complete(
    *,
    request_id: str,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    ttft_s: float | None = None,
    e2e_s: float | None = None,
    now: datetime | None = None,
    market: PostedPrices | None = None,
) -> LedgerEntry:
    """Charge a served request its tokens and close its hold; returns its token entry.

    ``prompt_tokens`` counts all prompt tokens, ``cached_tokens`` those of them that were
    cached; the latencies (seconds), when known, are kept on the request for the dashboards.
    A replayed report returns the first entry unchanged. UnknownRequest when no such request
    was opened; ValueError when it had failed (a failed request is never charged).

    The charge is at the prices of the market's row when it is written. ``market``, the
    request's market as the caller read it, saves reading them first when they are still the
    same (on PostgreSQL: the charge is then one statement).
    """
    now = now or timezone.now()
    tokens: TokensDetail = {
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "completion_tokens": completion_tokens,
    }
    latencies = {"ttft_s": ttft_s, "e2e_s": e2e_s}
    charge = {
        "request_id": request_id,
        "kind": ChargeKind.TOKENS,
        "round_id": "",
        "detail": tokens,
        "now": now,
        "request_fields": {**tokens, **{k: v for k, v in latencies.items() if v is not None}},
    }
    store = ledger_store()
    charged = Charged(Outcome.REPRICED)
    if market is not None:
        try:
            amount = token_charge(market=market, **tokens)
        except ValueError:
            pass  # said below, in the usual order
        else:
            charged = store.charge_write(**charge, amount=amount, priced_by=market)
    if charged.outcome == Outcome.REPRICED:
        prices = store.posted_prices(request_id=request_id)
        if prices is None:
            raise UnknownRequest(f"no request {request_id!r}")
        charged = store.charge_write(**charge, amount=token_charge(market=prices, **tokens))
    if charged.outcome == Outcome.UNKNOWN:
        raise UnknownRequest(f"no request {request_id!r}")
    if charged.outcome == Outcome.NOT_SERVED:
        raise ValueError(f"request {request_id!r} failed: it is not charged")
    if charged.outcome == Outcome.DUPLICATE:
        return LedgerEntry.objects.get(request_id=request_id, kind=ChargeKind.TOKENS)
    assert charged.entry is not None  # WRITTEN (a token charge is never PENDING)
    return charged.entry


@dataclass(frozen=True)
class SweepResult:
    """What :func:`holds_sweep` did, counted in requests."""

    pending_written: int = 0  # served, their pending priority charge written now
    holds_released: int = 0  # served long ago, their round record never came
    failed: int = 0  # queued far longer than any request is served in


def holds_sweep(
    *, settle_grace_s: float, stale_after_s: float, now: datetime | None = None
) -> SweepResult:
    """Close what a lost step left open, so that no hold reserves a budget for ever.

    - A served request with a priority charge still pending (the process stopped between its
      token charge and that write): the charge is written now.
    - A served request whose hold is still open ``settle_grace_s`` seconds after it finished:
      its round record was lost (an engine drops records while Redis is down); the rest of
      its hold is released. A record that comes later is charged what the budgets have left.
    - A request still queued ``stale_after_s`` seconds after it was opened: its gateway is
      gone (a client waits minutes at most); it fails, uncharged.
    Each is idempotent and safe beside live settlement (the same locked writes).
    """
    now = now or timezone.now()
    written = released = failed = 0
    pending = Request.objects.filter(status=RequestStatus.SERVED).exclude(priority_pending=None)
    store = ledger_store()
    for request_id, charge in pending.values_list("request_id", "priority_pending"):
        store.pending_write(request_id=request_id, pending=charge, now=now)
        written += 1
    open_holds = Hold.objects.filter(state=HoldState.OPEN).values("request_id")
    late = Request.objects.filter(
        status=RequestStatus.SERVED,
        finished_at__lt=now - timedelta(seconds=settle_grace_s),
        request_id__in=open_holds,
    )
    for request_id in late.values_list("request_id", flat=True):
        released += hold_release(request_id=request_id, now=now)
    stale = Request.objects.filter(
        status=RequestStatus.QUEUED, created_at__lt=now - timedelta(seconds=stale_after_s)
    )
    for request_id in stale.values_list("request_id", flat=True):
        failed += request_fail(request_id=request_id, now=now)
    if written or released or failed:
        logger.info(
            "holds sweep: %d pending priority charges written, %d holds released, %d stale "
            "requests failed",
            written,
            released,
            failed,
        )
    return SweepResult(pending_written=written, holds_released=released, failed=failed)
