"""Admitting a request (the gateway's first step; docs/api.md, "A request's path: admit, forward,
settle"): authenticate the API key, find
the market, choose the bid (explicit, else the tenant's autobidder, else 0), render the prompt,
and hold what it is likely to cost (``requests_open``). The gateway writes the holds of a
process's concurrent requests together, as it does their settlements (``batching``); an
autobid's hold is written with its bid, under the tenant's admission lock, which sees the
autobidder's requests in flight.

The hold: the tokens' worst case (prompt tokens x input price + max_tokens x output price, per
million) plus the priority hold (``accounts.rules.priority_hold``: effective bid x the
market's hold horizon, at most the request's priority cap). The priority cap is what the tenant
consents to pay for priority: effective bid x the market's ``max_wait_s`` for an explicit bid,
the autobid's own worst case for an autobid. A bid under the reserve buys no priority: its
effective bid, its cap and its priority hold are 0 (the engine gets the raw bid and applies the
same reserve itself)."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.utils import timezone

from accounts.models import ApiKey, BidSource, Request, Tenant
from accounts.money import ZERO, money, per_million
from accounts.rules import priority_hold
from accounts.services import (
    BudgetExhausted,
    Opening,
    request_fail,
    requests_open,
    requests_open_first,
)
from accounts.services.autobidder import LatencyTarget, autobid, autobid_admission, autobids
from market.models import Market
from mechanism.requests import effective_bid
from openai_api.gateway import metrics
from openai_api.gateway.batching import decided_first, ledger_batch
from openai_api.gateway.chat_templates import Prompt, chat_template, chat_template_loaded
from openai_api.gateway.db import db_call, db_call_retried, detached
from openai_api.gateway.errors import (
    BudgetExhaustedError,
    DatabaseUnavailable,
    InvalidValue,
    ModelNotFound,
)
from openai_api.gateway.instance import instance_id, instance_started
from openai_api.gateway.keys import api_key_authenticated, api_key_cached
from openai_api.gateway.selectors import (
    market_cached,
    market_for_model,
    priority_quote,
    target_quote,
)
from openai_api.gateway.validation import CHAT, CompletionParams


@dataclass
class Trace:
    """What the view needs for its metrics: filled in as the request goes."""

    endpoint: str
    market: str = metrics.NO_MARKET


@dataclass(frozen=True)
class Admitted:
    """A request recorded and held, ready to forward. Money in dollars (bids: per second)."""

    request_id: str
    market: Market
    bid: Decimal
    effective_bid: Decimal
    bid_source: str
    prompt: Prompt
    hold: Decimal
    owner: str = ""  # the tenant's tag for the engine (tenant-level charges): its id
    service_tier: str = "default"  # as the answer echoes it: default, flex or priority
    created: int = field(default_factory=lambda: int(time.time()))


def _prompt(params: CompletionParams, market: Market) -> Prompt:
    template = chat_template(market.chat_template)
    if params.endpoint == CHAT:
        return template.chat(params.messages)
    if params.prompt_ids is not None:
        return template.ids(params.prompt_ids)
    assert params.prompt_text is not None
    return template.text(params.prompt_text)


@dataclass(frozen=True)
class Admission:
    """A request admitted: what it is once opened (``admitted``), and its hold and row to write
    (``opening``; None when they are written already: an autobid's, opened with its bid)."""

    admitted: Admitted
    opening: Opening | None


def request_admit(*, params: CompletionParams, key: str | None, request_id: str) -> Admission:
    """Authenticate, find the market, choose the bid and what to hold (synchronous: run it on
    a database thread); the hold is then written in the process's batch of holds
    (:func:`admitted_for`). GatewayError subclasses say why a request is refused."""
    api_key = api_key_authenticated(key=key)
    return _admission(params=params, tenant=api_key.tenant, api_key=api_key, request_id=request_id)


def request_admit_for(
    *, params: CompletionParams, tenant: Tenant, api_key: ApiKey | None, request_id: str
) -> Admitted:
    """Admit a request and hold what it is likely to cost, now (synchronous), for a caller
    already known: ``tenant`` and its ``api_key`` (None: the tenant's own console). Used by
    batch jobs, which keep no key's secret."""
    admission = _admission(params=params, tenant=tenant, api_key=api_key, request_id=request_id)
    if admission.opening is not None:
        _opened(requests_open(openings=[admission.opening])[0])
    return admission.admitted


def _opened(result: Request | Exception) -> Request:
    """A request's row once opened; BudgetExhaustedError when a budget refused its hold."""
    if isinstance(result, BudgetExhausted):
        raise _refused(result)
    if isinstance(result, Exception):
        raise result
    return result


def _refused(exc: BudgetExhausted) -> BudgetExhaustedError:
    return BudgetExhaustedError(str(exc), budget=exc.figures())


async def _openings(openings: list[Opening]) -> list[Request | Exception]:
    """A batch of holds, in one statement on the event loop's connection
    (``accounts.services.requests_open_first``; the few it leaves: ``requests_open``)."""
    now = timezone.now()
    return await decided_first(
        requests_open_first(openings=openings, now=now),
        lane="holds",
        rest=lambda undecided: requests_open(openings=[openings[k] for k in undecided], now=now),
    )


def _admission(
    *,
    params: CompletionParams,
    tenant: Tenant,
    api_key: ApiKey | None,
    request_id: str,
    market: Market | None = None,
) -> Admission:
    """The admission of ``params`` for ``tenant`` (``market``: its market when the caller found
    it already)."""
    market = market or market_for_model(model=params.model)
    if market is None:
        raise ModelNotFound(f"no market serves the model {params.model!r}", param="model")
    prompt = _prompt(params, market)
    if prompt.tokens == 0:
        raise InvalidValue("the prompt has no tokens", param="prompt")
    tokens_hold = per_million(
        tokens=prompt.tokens, price_per_million=market.price_input_per_mtok
    ) + per_million(tokens=params.max_tokens, price_per_million=market.price_output_per_mtok)

    def opening(
        bid: Decimal, source: str, effective: Decimal, cap: Decimal, tier: str = "default"
    ) -> Admission:
        priority = priority_hold(
            effective_bid=effective, horizon_s=market.hold_horizon_s, consent_cap=money(cap)
        )
        hold = money(tokens_hold + priority)
        to_open = Opening(
            request_id=request_id,
            tenant=tenant,
            api_key=api_key,
            market=market,
            bid=bid,
            hold_amount=hold,
            request_class=params.request_class,
            bid_source=source,
            priority_cap=money(cap),
            gateway=instance_id(),
        )
        admitted = Admitted(
            request_id, market, bid, effective, source, prompt, hold, owner=str(tenant.pk),
            service_tier=tier,
        )  # fmt: skip
        return Admission(admitted, to_open)

    reserve = market.reserve
    wait_s = Decimal(repr(market.max_wait_s))
    if params.bid is not None:  # an explicit bid wins over the service tier
        effective = effective_bid(params.bid, reserve, zero=ZERO)
        return opening(params.bid, BidSource.EXPLICIT, effective, effective * wait_s)
    if params.service_tier == "flex":  # served when capacity allows: no priority bought
        return opening(ZERO, BidSource.TIER, ZERO, ZERO, tier="flex")
    if params.service_tier == "priority":
        bid = capped_quote(priority_quote(market=market), tenant)
        effective = effective_bid(bid, reserve, zero=ZERO)
        return opening(bid, BidSource.TIER, effective, effective * wait_s, tier="priority")
    if not autobids(tenant=tenant, request_class=params.request_class):
        return opening(ZERO, BidSource.NONE, ZERO, ZERO)

    def quoted(target: LatencyTarget) -> Decimal:  # a class's latency target, as tier priority
        return capped_quote(
            target_quote(market=market, ttft_s=target.ttft_s, probability=target.p), tenant
        )

    # The autobidder's bid depends on its requests in flight: bid and open as one admission.
    with autobid_admission(tenant=tenant):
        auto = autobid(tenant=tenant, request_class=params.request_class, quoted=quoted)
        if auto is None:
            admission = opening(ZERO, BidSource.NONE, ZERO, ZERO)
        else:
            effective = effective_bid(auto.bid, reserve, zero=ZERO)
            cap = auto.worst_case if effective > 0 else ZERO
            admission = opening(auto.bid, BidSource.AUTOBID, effective, cap)
        assert admission.opening is not None
        _opened(requests_open(openings=[admission.opening])[0])
        return Admission(admission.admitted, None)


def capped_quote(quoted: Decimal | None, tenant: Tenant) -> Decimal:
    """What a quote is bid as, dollars per second: the quote under the tenant's
    ``priority_bid_cap``, the cap itself when nothing is quoted (too short a history, or no
    recent bid bought the target)."""
    cap = tenant.priority_bid_cap
    return cap if quoted is None else min(quoted, cap)


def _admission_cached(
    *, params: CompletionParams, key: str | None, request_id: str
) -> Admission | None:
    """:func:`request_admit` on the event loop, for a request whose admission reads nothing
    from the database or a file: its bid chosen without a quote or the autobidder (an explicit
    bid, or tier flex), its key and market in this process's caches, its market's chat
    template loaded, and the process's instance id made (its first beat goes to Redis). None
    otherwise: the caller admits it on a database thread. When everything is cached, as it is
    for nearly every request, the thread hop there and back costs more than the admission's
    own work."""
    if params.bid is None and params.service_tier != "flex":
        return None
    api_key = api_key_cached(key=key)
    market = market_cached(model=params.model)
    if api_key is None or market is None or not instance_started():
        return None
    if not chat_template_loaded(market.chat_template):
        return None
    return _admission(
        params=params, tenant=api_key.tenant, api_key=api_key, request_id=request_id, market=market
    )


async def _admitted(params: CompletionParams, key: str | None, request_id: str) -> Admitted:
    admission = _admission_cached(params=params, key=key, request_id=request_id)
    if admission is None:
        admission = await db_call(request_admit, params=params, key=key, request_id=request_id)
    if admission.opening is not None:
        await request_held(admission.opening)
    return admission.admitted


async def request_held(opening: Opening) -> Request:
    """Hold a request and record it in this process's batch of holds (``batching``): its row;
    BudgetExhaustedError when a budget refuses it."""
    try:
        return await ledger_batch(_openings, kind="holds").result(opening)
    except BudgetExhausted as exc:
        raise _refused(exc) from None


async def admitted_for(params: CompletionParams, key: str | None, trace: Trace) -> Admitted:
    request_id = "gw-" + uuid.uuid4().hex
    task = detached(_admitted(params, key, request_id))
    try:
        admitted = await asyncio.shield(task)
    except asyncio.CancelledError:  # the client went away: release the hold once it is placed
        detached(_failed_after(task, request_id))
        raise
    except DatabaseUnavailable:  # the hold's commit may have reached the database: release it
        detached(released(request_id))
        raise
    trace.market = admitted.market.slug
    metrics.BIDS.labels(trace.market, admitted.bid_source).observe(float(admitted.bid))
    return admitted


async def _failed_after(task: asyncio.Task[Admitted], request_id: str) -> None:
    try:
        await task
    except DatabaseUnavailable:
        pass  # whether the hold was placed is unknown: release it
    except Exception:  # noqa: BLE001 (refused: nothing was held)
        return
    await released(request_id)


async def released(request_id: str) -> None:
    """Fail the request and release its hold, nothing charged (``request_fail``, which may be
    repeated). While the database cannot be reached this goes on in the background, tried
    again for up to ``STALE_REQUEST_S`` (past that, the holds sweep does it)."""
    try:
        await db_call(request_fail, request_id=request_id)
    except DatabaseUnavailable:
        detached(
            db_call_retried(request_fail, request_id=request_id, within_s=settings.STALE_REQUEST_S)
        )
