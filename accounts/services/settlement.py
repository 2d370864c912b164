"""Requests and their settlement into the ledger (DESIGN.md 4.5 and 6).

A request's life: :func:`request_open` (the gateway holds its worst case), then either it is
admitted in a round (the round record's priority charge, :func:`round_record_settle`) and
completes (:func:`request_complete`, the token charge), or it fails (:func:`request_fail`, the
hold is released, nothing charged). Each charge is one ledger entry, unique per (request,
kind): replaying a round record or a completion report changes nothing. The entry, the hold it
consumes and the budget counters commit together, with the request's row locked first.

On PostgreSQL each of these steps is one statement (``accounts.services.fastpath``); the ORM
code here is the reference, and runs on other databases and whenever a statement declines.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.charge_rule import Allowed, capped_detail, charge_allowed, hold_after
from accounts.models import (
    ApiKey,
    Autobidder,
    BidSource,
    ChargeKind,
    Hold,
    HoldState,
    LedgerEntry,
    Request,
    RequestStatus,
    Tenant,
)
from accounts.money import ZERO, PostedPrices, Prices, money, money_str, per_million
from accounts.services import fastpath
from accounts.services.budgets import (
    budget_counters_ensure,
    budget_counters_locked,
    budget_counters_saved,
    budget_room,
    hold_amount_checked,
    hold_fast,
    hold_reference,
    hold_release,
    hold_released,
)
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
    if fastpath.available():
        request = {"market": market.pk, **{k: v for k, v in fields.items() if k != "market_id"}}
        placed = hold_fast(
            tenant=tenant,
            api_key=api_key,
            request_id=request_id,
            amount=amount,
            now=now,
            request=request,
        )
        if placed is not None and placed.request_created:
            return fastpath.model_loaded(
                Request,
                {
                    "request_id": request_id,
                    "tenant_id": tenant.pk,
                    "api_key_id": api_key.pk if api_key else None,
                    "status": RequestStatus.QUEUED,
                    "created_at": now,
                    **dict.fromkeys(_UNSET_AT_OPEN),
                    **fields,
                },
            )
        if placed is not None:  # the hold is new but the request's row was there already
            return Request.objects.get(request_id=request_id)
    with transaction.atomic():
        hold_reference(
            tenant=tenant, api_key=api_key, request_id=request_id, amount=amount, now=now
        )
        request, _ = Request.objects.get_or_create(
            request_id=request_id,
            defaults={"tenant": tenant, "api_key": api_key, "created_at": now, **fields},
        )
    return request


# A request's fields that only its settlement fills in.
_UNSET_AT_OPEN = (
    "admitted_at",
    "finished_at",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "ttft_s",
    "e2e_s",
)


def request_fail(*, request_id: str, now: datetime | None = None) -> bool:
    """Mark a request that was not served as failed and release its hold (no charge).

    Returns whether the request was still queued. A failed request is never charged later,
    even if a round record admitting it arrives afterwards.
    """
    now = now or timezone.now()
    if fastpath.available():
        fast = fastpath.hold_close(request_id=request_id, now=now, fail_request=True)
        if fast.counted:
            return fast.failed if fast.request_found else fast.released
    owner = Request.objects.filter(request_id=request_id).values("tenant_id", "api_key_id").first()
    if owner is None:
        return hold_release(request_id=request_id, now=now)
    with transaction.atomic():
        budget_counters_ensure(**owner, now=now)
        # Lock order everywhere: the request, then its hold, then the counters.
        Request.objects.select_for_update().filter(request_id=request_id).exists()
        failed = Request.objects.filter(request_id=request_id, status=RequestStatus.QUEUED).update(
            status=RequestStatus.FAILED, finished_at=now
        )
        hold_released(request_id=request_id, now=now)
    return failed == 1


UNKNOWN = "unknown"
NOT_SERVED = "not_served"
DUPLICATE = "duplicate"
REPRICED = "repriced"
PENDING = "pending"


def _charge(
    *,
    request_id: str,
    kind: str,
    amount: Decimal,
    round_id: str,
    detail: dict[str, Any],
    now: datetime,
    market_slug: str | None = None,
    request_fields: dict[str, Any] | None = None,
    priced_by: PostedPrices | None = None,
) -> LedgerEntry | str:
    """Write one ledger entry, consume the request's hold and count the charge in the budget
    counters, atomically, with the request locked. Returns the entry, or UNKNOWN (no such
    request, or not of ``market_slug``), DUPLICATE (it exists: a replay), NOT_SERVED (the
    request failed), PENDING (a priority charge of a request still in flight: kept on its row
    until it is served) or REPRICED (``amount`` was computed from ``priced_by``, a market whose
    prices are not, or no longer, those of the request's market) when no entry was written.

    The amount written is :func:`accounts.charge_rule.charge_allowed`'s: never past the
    request's ``priority_cap`` (a priority charge), what its hold and every budget that
    applies have left, or (autobid requests) its autobidder's budget; what a cap cut is in the
    detail. A token charge completes the request: it is marked served (with
    ``request_fields``), its hold keeps only the priority part still to come, and a priority
    charge left pending is written next.
    """
    if fastpath.available():
        tokens = None
        if kind == ChargeKind.TOKENS:
            tokens = {"ttft_s": None, "e2e_s": None, **(request_fields or detail)}
        fast = fastpath.charge_write(
            request_id=request_id,
            kind=kind,
            amount=amount,
            round_id=round_id,
            detail=detail,
            now=now,
            market_slug=market_slug,
            tokens=tokens,
            prices=None if priced_by is None else _prices(priced_by),
        )
        if fast.status is None:
            return UNKNOWN
        if fast.status == RequestStatus.FAILED:
            return NOT_SERVED
        if fast.pending_stored:
            return PENDING
        if fast.entry_id is not None:
            allowed = Allowed(amount=fast.amount, capped_by=fast.capped_by)
            entry = fastpath.model_loaded(
                LedgerEntry,
                {
                    "id": fast.entry_id,
                    "request_id": request_id,
                    "kind": kind,
                    "tenant_id": fast.tenant_id,
                    "api_key_id": fast.api_key_id,
                    "market_id": fast.market_id,
                    "round_id": round_id,
                    "amount": fast.amount,
                    "detail": capped_detail(detail, allowed=allowed, asked=amount),
                    "created_at": now,
                },
            )
            if fast.pending is not None:
                _pending_settle(request_id=request_id, pending=fast.pending, now=now)
            return entry
        if not fast.priced:
            return REPRICED
        if fast.counted:
            return DUPLICATE
    elif priced_by is not None:
        return REPRICED  # the reference code reads the prices itself
    return _charge_reference(
        request_id=request_id,
        kind=kind,
        amount=amount,
        round_id=round_id,
        detail=detail,
        now=now,
        market_slug=market_slug,
        request_fields=request_fields,
    )


def _pending_settle(*, request_id: str, pending: dict[str, Any], now: datetime) -> None:
    """Write the priority charge a served request had pending (its hold reserves it)."""
    _charge(
        request_id=request_id,
        kind=ChargeKind.PRIORITY,
        amount=Decimal(pending["amount"]),
        round_id=pending["round_id"],
        detail=pending["detail"],
        now=now,
    )


def _prices(market: PostedPrices) -> dict[str, Any]:
    return {
        "market": market.pk,
        "price_input": market.price_input_per_mtok,
        "price_cached": market.price_cached_input_per_mtok,
        "price_output": market.price_output_per_mtok,
    }


def _charge_reference(
    *,
    request_id: str,
    kind: str,
    amount: Decimal,
    round_id: str,
    detail: dict[str, Any],
    now: datetime,
    market_slug: str | None,
    request_fields: dict[str, Any] | None,
) -> LedgerEntry | str:
    """:func:`_charge` with the ORM."""
    owner = (
        Request.objects.filter(request_id=request_id)
        .values("tenant_id", "api_key_id", "market__slug")
        .first()
    )
    if owner is None or (market_slug is not None and owner["market__slug"] != market_slug):
        return UNKNOWN
    completes = kind == ChargeKind.TOKENS
    scope = {"tenant_id": owner["tenant_id"], "api_key_id": owner["api_key_id"]}
    with transaction.atomic():
        budget_counters_ensure(**scope, now=now)
        # Lock order everywhere: the request, its hold, the counters, the autobidder.
        request = Request.objects.select_for_update().get(pk=request_id)
        if request.status == RequestStatus.FAILED:
            return NOT_SERVED
        if LedgerEntry.objects.filter(request_id=request_id, kind=kind).exists():
            return DUPLICATE
        if not completes and request.status == RequestStatus.QUEUED:
            if request.priority_pending is not None:
                return DUPLICATE
            pending = {"amount": money_str(amount), "round_id": round_id, "detail": detail}
            request.priority_pending = pending
            request.admitted_at = request.admitted_at or now
            request.save(update_fields=["priority_pending", "admitted_at"])
            return PENDING
        open_hold = Hold.objects.select_for_update().filter(
            request_id=request_id, state=HoldState.OPEN
        )
        hold = open_hold.first()
        counters = budget_counters_locked(**scope)
        autobidder = None
        if not completes and request.bid_source == BidSource.AUTOBID:
            locked = Autobidder.objects.select_for_update()
            autobidder = locked.filter(tenant_id=scope["tenant_id"]).first()
        remaining = hold.remaining if hold is not None else ZERO
        allowed = charge_allowed(
            asked=amount,
            priority_cap=None if completes else request.priority_cap,
            hold_remaining=remaining,
            budget_room=budget_room(**scope, counters=counters, now=now),
            autobidder_room=None if autobidder is None else autobidder.budget_left(now=now),
        )
        entry = LedgerEntry.objects.create(
            request_id=request_id,
            kind=kind,
            **scope,
            market_id=request.market_id,
            round_id=round_id,
            amount=allowed.amount,
            detail=capped_detail(detail, allowed=allowed, asked=amount),
            created_at=now,
        )
        pending = request.priority_pending if completes else None
        if completes:
            Request.objects.filter(pk=request_id).update(
                status=RequestStatus.SERVED, finished_at=now, **(request_fields or detail)
            )
            # The hold keeps the priority part still to come: none when no cap was recorded
            # or it is 0 (no effective bid) and nothing is pending, or when it is settled.
            cap = request.priority_cap
            priority_settled = LedgerEntry.objects.filter(
                request_id=request_id, kind=ChargeKind.PRIORITY
            ).exists()
            close = priority_settled or (pending is None and (cap is None or cap == 0))
        else:
            Request.objects.filter(pk=request_id).update(
                admitted_at=request.admitted_at or now, priority_pending=None
            )
            close = True
        released = ZERO
        if hold is not None:
            hold.remaining = hold_after(
                remaining=remaining,
                consumed=min(allowed.amount, remaining),
                close=close,
                priority_cap=request.priority_cap,
            )
            if close:
                hold.state, hold.closed_at = HoldState.SETTLED, now
            hold.save(update_fields=["remaining", "state", "closed_at"])
            released = remaining - hold.remaining
        for counter in counters:
            counter.charge_counted(amount=allowed.amount, at=now)
            counter.held -= released
        budget_counters_saved(counters)
        if autobidder is not None:
            autobidder.charge_counted(amount=allowed.amount, at=now)
            autobidder.save(update_fields=["spent_start", "spent_in_window"])
        if pending is not None:
            _pending_settle(request_id=request_id, pending=pending, now=now)
        return entry


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
        detail = {
            "bid": adm["bid"],
            "effective_bid": adm["effective_bid"],
            "time_saved_s": adm["time_saved_s"],
            "planned_completion_s": adm["planned_completion_s"],
            "position": adm["position"],
            "engine_charge": adm["charge"],
        }
        if isinstance(adm.get("block"), dict):
            detail["block"] = adm["block"]  # the subtree it waited in: "why this rank"
        entry = _charge(
            request_id=adm["request_id"],
            kind=ChargeKind.PRIORITY,
            amount=money(adm["charge"]),
            round_id=record["round_id"],
            detail=detail,
            now=now,
            market_slug=record["market"],
        )
        if entry == UNKNOWN:
            logger.warning(
                "round %s admits unknown request %r", record["round_id"], adm["request_id"]
            )
            counts["unknown"] += 1
        elif entry == NOT_SERVED:
            counts["not_served"] += 1
        elif entry == DUPLICATE:
            counts["duplicates"] += 1
        elif entry == PENDING:
            counts["pending"] += 1
        else:
            counts["charged"] += 1
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
    tokens = {
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
    entry: LedgerEntry | str = REPRICED
    if market is not None and fastpath.available():
        try:
            amount = token_charge(market=market, **tokens)
        except ValueError:
            pass  # said below, in the usual order
        else:
            entry = _charge(**charge, amount=amount, priced_by=market)
    if entry == REPRICED:
        entry = _charge(**charge, amount=token_charge(market=_market_of(request_id), **tokens))
    if entry == UNKNOWN:
        raise UnknownRequest(f"no request {request_id!r}")
    if entry == NOT_SERVED:
        raise ValueError(f"request {request_id!r} failed: it is not charged")
    if entry == DUPLICATE:
        return LedgerEntry.objects.get(request_id=request_id, kind=ChargeKind.TOKENS)
    return entry


def _market_of(request_id: str) -> PostedPrices:
    """The market of ``request_id`` with its posted prices now (UnknownRequest if none)."""
    if fastpath.available():
        prices = fastpath.request_prices(request_id=request_id)
        if prices is not None:
            return Prices(
                price_input_per_mtok=prices[0],
                price_cached_input_per_mtok=prices[1],
                price_output_per_mtok=prices[2],
            )
    else:
        request = Request.objects.select_related("market").filter(request_id=request_id).first()
        if request is not None:
            return request.market
    raise UnknownRequest(f"no request {request_id!r}")


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
    for request_id, charge in pending.values_list("request_id", "priority_pending"):
        _pending_settle(request_id=request_id, pending=charge, now=now)
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
