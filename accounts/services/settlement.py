"""Requests and their settlement into the ledger (DESIGN.md 4.5 and 6).

A request's life: :func:`request_open` (the gateway holds its worst case), then either it is
admitted in a round (the round record's priority charge, :func:`round_record_settle`) and
completes (:func:`request_complete`, the token charge), or it fails (:func:`request_fail`, the
hold is released, nothing charged). Each charge is one ledger entry, unique per (request,
kind): replaying a round record or a completion report changes nothing. The entry and the
hold it consumes commit together, with the request's budget rows locked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import ApiKey, ChargeKind, LedgerEntry, Request, RequestStatus, Tenant
from accounts.money import money, per_million
from accounts.services.budgets import budget_hold, budgets_locked, hold_consume, hold_release
from market.models import Market
from scheduler_bridge.records import RoundRecord, round_record_checked

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


def request_open(
    *,
    request_id: str,
    tenant: Tenant,
    api_key: ApiKey | None,
    market: Market,
    bid: Decimal | float | str,
    hold_amount: Decimal | float | str,
    request_class: str = "interactive",
    bid_source: str = "none",
    now: datetime | None = None,
) -> Request:
    """Record a request the gateway is about to forward, and hold ``hold_amount`` dollars.

    Raises ``BudgetExhausted`` (nothing written) when the hold does not fit. ``bid`` is in
    dollars per second of waiting. Idempotent per ``request_id``.
    """
    now = now or timezone.now()
    with transaction.atomic():
        budget_hold(
            tenant=tenant, api_key=api_key, request_id=request_id, amount=hold_amount, now=now
        )
        request, _ = Request.objects.get_or_create(
            request_id=request_id,
            defaults={
                "tenant": tenant,
                "api_key": api_key,
                "market": market,
                "bid": money(bid),
                "request_class": request_class,
                "bid_source": bid_source,
                "created_at": now,
            },
        )
    return request


def request_fail(*, request_id: str, now: datetime | None = None) -> bool:
    """Mark a request that was not served as failed and release its hold (no charge).

    Returns whether the request was still queued. A failed request is never charged later,
    even if a round record admitting it arrives afterwards.
    """
    now = now or timezone.now()
    request = Request.objects.filter(request_id=request_id).first()
    if request is None:
        return hold_release(request_id=request_id, now=now)
    with transaction.atomic():
        # Lock order everywhere: budgets, then the request, then its hold.
        budgets_locked(tenant_id=request.tenant_id, api_key_id=request.api_key_id)
        failed = Request.objects.filter(request_id=request_id, status=RequestStatus.QUEUED).update(
            status=RequestStatus.FAILED, finished_at=now
        )
        hold_release(request_id=request_id, now=now)
    return failed == 1


NOT_SERVED = "not_served"
DUPLICATE = "duplicate"


def _charge(
    *,
    request: Request,
    kind: str,
    amount: Decimal,
    round_id: str,
    detail: dict[str, Any],
    now: datetime,
    request_fields: dict[str, Any] | None = None,
) -> LedgerEntry | str:
    """Write one ledger entry and consume the request's hold, atomically, with its budgets and
    then the request locked. Returns the entry, or DUPLICATE (it exists: a replay) or
    NOT_SERVED (the request failed) when nothing was written.

    A token charge completes the request: it is marked served and its hold closed.
    """
    completes = kind == ChargeKind.TOKENS
    with transaction.atomic():
        budgets_locked(tenant_id=request.tenant_id, api_key_id=request.api_key_id)
        status = (
            Request.objects.select_for_update().filter(pk=request.pk).values_list("status")
        ).get()[0]
        if status == RequestStatus.FAILED:
            return NOT_SERVED
        if LedgerEntry.objects.filter(request=request, kind=kind).exists():
            return DUPLICATE
        try:
            with transaction.atomic():
                entry = LedgerEntry.objects.create(
                    request=request,
                    kind=kind,
                    tenant_id=request.tenant_id,
                    api_key_id=request.api_key_id,
                    market_id=request.market_id,
                    round_id=round_id,
                    amount=amount,
                    detail=detail,
                    created_at=now,
                )
        except IntegrityError:
            return DUPLICATE  # settled concurrently by another worker
        if completes:
            Request.objects.filter(pk=request.pk).update(
                status=RequestStatus.SERVED, finished_at=now, **(request_fields or detail)
            )
        else:
            Request.objects.filter(pk=request.pk, admitted_at=None).update(admitted_at=now)
        # A charge above the hold is still charged in full (money is never lost); the budget
        # check of the next hold sees it as spend.
        hold_consume(request_id=request.request_id, amount=amount, close=completes, now=now)
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
    admitted = record["admitted"]
    requests = Request.objects.select_related("market").in_bulk([a["request_id"] for a in admitted])
    counts = {"charged": 0, "duplicates": 0, "unknown": 0, "not_served": 0}
    for adm in admitted:
        request = requests.get(adm["request_id"])
        if request is None or request.market.slug != record["market"]:
            logger.warning(
                "round %s admits unknown request %r", record["round_id"], adm["request_id"]
            )
            counts["unknown"] += 1
            continue
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
            request=request,
            kind=ChargeKind.PRIORITY,
            amount=money(adm["charge"]),
            round_id=record["round_id"],
            detail=detail,
            now=now,
        )
        if entry == NOT_SERVED:
            counts["not_served"] += 1
        elif entry == DUPLICATE:
            counts["duplicates"] += 1
        else:
            counts["charged"] += 1
    return SettleResult(**counts)


def token_charge(
    *, market: Market, prompt_tokens: int, cached_tokens: int, completion_tokens: int
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
) -> LedgerEntry:
    """Charge a served request its tokens and close its hold; returns its token entry.

    ``prompt_tokens`` counts all prompt tokens, ``cached_tokens`` those of them that were
    cached; the latencies (seconds), when known, are kept on the request for the dashboards.
    A replayed report returns the first entry unchanged. UnknownRequest when no such request
    was opened; ValueError when it had failed (a failed request is never charged).
    """
    now = now or timezone.now()
    request = Request.objects.select_related("market").filter(request_id=request_id).first()
    if request is None:
        raise UnknownRequest(f"no request {request_id!r}")
    amount = token_charge(
        market=request.market,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
    )
    tokens = {
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "completion_tokens": completion_tokens,
    }
    latencies = {"ttft_s": ttft_s, "e2e_s": e2e_s}
    entry = _charge(
        request=request,
        kind=ChargeKind.TOKENS,
        amount=amount,
        round_id="",
        detail=tokens,
        now=now,
        request_fields={**tokens, **{k: v for k, v in latencies.items() if v is not None}},
    )
    if entry == NOT_SERVED:
        raise ValueError(f"request {request_id!r} failed: it is not charged")
    if entry == DUPLICATE:
        return LedgerEntry.objects.get(request=request, kind=ChargeKind.TOKENS)
    return entry
