"""The gateway's request flow: admit, forward, settle (docs/api.md, "A request's path: admit,
forward, settle").

1. **Admit** (one step on a database thread, ``request_admit``): authenticate the API key (cached
   for ``GATEWAY_API_KEY_CACHE_S`` seconds, default 5), find the market, choose the bid (explicit,
   else the tenant's autobidder, else 0), render the prompt, and hold what it is likely to cost
   with ``request_open`` (``admission`` says how the hold is sized).
2. **Forward** through the engine client, with the Request's id as the engine's rid.
3. **Settle**: served, ``request_settled`` writes both charges from the engine's answer, the
   token charge and the priority charge the engine computed in the round that admitted it
   (its only route to the ledger), and closes the hold, in the process's next batch of
   settlements (``batching``: one statement for the settlements of concurrent requests); a
   batch job's item is settled alone, in one transaction with its answer; not served (engine
   down or silent past its timeouts, queue full, refused, the client gone before any token: a
   client that disconnects while it waits cancels the engine call), ``request_fail`` releases
   the hold and nothing is charged. A stream the client leaves half-way is charged the tokens
   it was sent and its priority charge (it was admitted).

Settling runs to the end even when the client goes away (``db.shielded``), and at most once per
request; the ledger's (request, kind) key makes a replay change nothing anyway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, TypeVar

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts.figures import usd
from accounts.ledger import Outcome, Usage
from accounts.models import PriorityDetail
from accounts.money import money
from accounts.services import (
    PriorityCharge,
    Served,
    Settled,
    requests_settle,
    requests_settle_first,
)
from engines.client import (
    EngineChunk,
    EngineError,
    EngineMeta,
    EngineOutput,
    EngineOverloaded,
    EngineRejected,
    EngineTimedOut,
    EngineTimeouts,
    engine_client,
    generate_body,
)
from market.models import Market
from openai_api.gateway import metrics, responses
from openai_api.gateway.admission import Admitted, Trace, admitted_for, released
from openai_api.gateway.batching import decided_first, ledger_batch
from openai_api.gateway.db import (
    OUTAGE_RETRY_S,
    db_call,
    db_call_retried,
    detached,
    retried,
    shielded,
)
from openai_api.gateway.errors import (
    DatabaseUnavailable,
    EngineBidLost,
    EngineBusy,
    EngineDown,
    EngineTimeout,
    GatewayError,
    MalformedRequest,
    ModelNotFound,
)
from openai_api.gateway.keys import api_key_authenticated
from openai_api.gateway.queries import QuoteQuery
from openai_api.gateway.selectors import market_for_model, models_served, quote_for
from openai_api.gateway.validation import CHAT, CompletionParams

logger = logging.getLogger(__name__)
T = TypeVar("T")


def _priority_charge(meta: EngineMeta) -> PriorityCharge | None:
    """The priority charge the engine reported for a request it admitted, with its round's
    view of the request; None when it reported none (or an unusable one: logged)."""
    if meta.charge is None or meta.round_id is None:
        return None
    if meta.charge < 0:
        logger.error("the engine reported a negative priority charge (%r): ignored", meta.charge)
        return None
    detail: PriorityDetail = {
        "bid": meta.bid if meta.bid is not None else 0.0,
        "effective_bid": meta.effective_bid if meta.effective_bid is not None else 0.0,
        "time_saved_s": meta.time_saved_s if meta.time_saved_s is not None else 0.0,
        "planned_completion_s": meta.planned_completion_s or 0.0,
        "position": meta.position if meta.position is not None else 0,
        "engine_charge": meta.charge,
        "block": dict(meta.block) if meta.block is not None else {},  # type: ignore[typeddict-item]
    }
    if meta.engine is not None:
        detail["engine"] = meta.engine  # which replica admitted it
    if meta.rank is not None and meta.ahead is not None and meta.queue_len is not None:
        detail["rank"] = meta.rank  # its place in line when it joined the queue
        detail["ahead"] = meta.ahead
        detail["queue_len"] = meta.queue_len
    return PriorityCharge(amount=money(meta.charge), round_id=meta.round_id, detail=dict(detail))


def _served(*, request_id: str, meta: EngineMeta, market: Market) -> Served:
    """A served request to settle from its engine's answer: its tokens, its priority charge
    and its engine-side latencies. ``market`` (as admitted) only saves reading its prices
    again while they are unchanged: the charge is at the prices of the market's row when it
    is written."""
    e2e = meta.raw.get("e2e_latency")
    usage = Usage(
        prompt_tokens=meta.prompt_tokens,
        cached_tokens=min(meta.cached_tokens, meta.prompt_tokens),
        completion_tokens=meta.completion_tokens,
        ttft_s=meta.ttft_s,
        e2e_s=float(e2e) if isinstance(e2e, int | float) else None,
    )
    return Served(request_id, usage, _priority_charge(meta), market)


def _charged(settled: Settled, market: Market) -> Settled:
    if settled.outcome == Outcome.WRITTEN:
        metrics.charged(
            market=market.slug,
            tokens=settled.tokens.amount if settled.tokens is not None else None,
            priority=settled.priority.amount if settled.priority is not None else None,
        )
    return settled


def _settle(*, request_id: str, meta: EngineMeta, market: Market) -> Settled:
    """Settle a served request alone (synchronous), in the caller's transaction."""
    result = requests_settle(served=[_served(request_id=request_id, meta=meta, market=market)])
    if isinstance(result[0], Exception):
        raise result[0]
    return _charged(result[0], market)


async def _settled(
    *, request_id: str, meta: EngineMeta, market: Market, within_s: float = OUTAGE_RETRY_S
) -> Settled:
    served = _served(request_id=request_id, meta=meta, market=market)
    return _charged(await request_settled(served, within_s=within_s), market)


async def request_settled(served: Served, *, within_s: float = OUTAGE_RETRY_S) -> Settled:
    """Settle a served request in this process's batch of settlements (``batching``), tried
    again while the database cannot be reached, for up to ``within_s`` seconds."""
    batch = ledger_batch(_settlements, kind="settlements")
    return await retried(lambda: batch.result(served), within_s=within_s)


async def _settlements(served: list[Served]) -> list[Settled | Exception]:
    """A batch of settlements, in one statement on the event loop's connection
    (``accounts.services.requests_settle_first``; the few it leaves: ``requests_settle``)."""
    now = timezone.now()
    return await decided_first(
        requests_settle_first(served=served, now=now),
        lane="settlements",
        rest=lambda undecided: requests_settle(served=[served[k] for k in undecided], now=now),
    )


def engine_timeouts() -> EngineTimeouts:
    """The engine client's waits, seconds, from the settings ``ENGINE_CONNECT_TIMEOUT_S``,
    ``ENGINE_READ_TIMEOUT_S`` and ``ENGINE_ANSWER_TIMEOUT_S`` (read per request)."""
    return EngineTimeouts(
        connect_s=settings.ENGINE_CONNECT_TIMEOUT_S,
        read_s=settings.ENGINE_READ_TIMEOUT_S,
        answer_s=settings.ENGINE_ANSWER_TIMEOUT_S,
    )


def _engine_failure(exc: EngineError, *, charged: Settled | None = None) -> GatewayError:
    """The answer for an engine failure; ``charged``: the settlement of a stream that failed
    mid-way (the tokens it had sent, and its priority: the answer says so, not "not
    charged")."""
    if charged is not None and charged.tokens is not None:
        error = EngineTimeout if isinstance(exc, EngineTimedOut) else EngineDown
        priority = charged.priority
        also = "" if priority is None else f" with the request's priority ({usd(priority.amount)})"
        return error(
            f"the engine failed mid-answer; the tokens sent were charged "
            f"({usd(charged.tokens.amount)}){also}, the rest of the answer is not: {exc.message}"
        )
    if isinstance(exc, EngineOverloaded):
        seconds = max(1, round(exc.retry_after_s))
        return EngineBusy.retrying("the engine's queue is full", seconds, f": {exc.message}")
    if isinstance(exc, EngineRejected):
        return MalformedRequest(
            f"the engine refused the request: {exc.message}",
            param=exc.param,
            code="engine_rejected",
        )
    if isinstance(exc, EngineTimedOut):
        return EngineTimeout(f"the engine timed out; the request was not charged: {exc.message}")
    return EngineDown(f"the engine is unavailable; the request was not charged: {exc.message}")


def _bid_lost(admitted: Admitted, meta: EngineMeta) -> EngineBidLost | None:
    """The error when the engine reports another bid than the one sent (or none), else None."""
    sent = float(admitted.bid)
    if meta.bid == sent:
        return None
    read = "no bid" if meta.bid is None else f"a bid of {meta.bid!r} $/s"
    logger.error(
        "request %s: sent a bid of %r $/s, the engine reported %s: is the market's plugin "
        "loaded, and does the route to it keep sampling_params.custom_params?",
        admitted.request_id, sent, read,
    )  # fmt: skip
    return EngineBidLost(
        f"the engine reported {read} for a request sent with a bid of {sent!r} $/s; the "
        "request was not served at its priority and was not charged"
    )


def _body(admitted: Admitted, params: CompletionParams, stream: bool) -> dict:
    return generate_body(
        rid=admitted.request_id,
        max_new_tokens=params.max_tokens,
        bid=float(admitted.bid),
        text=admitted.prompt.text,
        input_ids=admitted.prompt.input_ids,
        sampling_params=params.sampling,
        stream=stream,
        owner=admitted.owner,
    )


def _auction(admitted: Admitted, meta: EngineMeta | None, settled: Settled | None) -> dict:
    return responses.auction_body(
        bid=admitted.bid,
        effective_bid=admitted.effective_bid,
        reserve=admitted.market.reserve,
        bid_source=admitted.bid_source,
        meta=meta,
        settled=settled,
    )


def _shape(params: CompletionParams, admitted: Admitted) -> dict[str, Any]:
    """What every body and chunk of the answer to ``params`` says about it."""
    prefix = "chatcmpl-" if params.endpoint == CHAT else "cmpl-"
    return {
        "endpoint": params.endpoint,
        "response_id": prefix + admitted.request_id,
        "created": admitted.created,
        "model": admitted.market.served_model,
        "service_tier": admitted.service_tier,
    }


async def completion_create(*, params: CompletionParams, key: str | None, trace: Trace) -> dict:
    """A non-streamed chat or text completion: the response body (GatewayError on failure)."""
    admitted = await admitted_for(params, key, trace)
    return await completion_forward(params=params, admitted=admitted, trace=trace)


async def completion_forward(
    *,
    params: CompletionParams,
    admitted: Admitted,
    trace: Trace,
    on_settled: Callable[[dict], None] | None = None,
) -> dict:
    """Forward an admitted, non-streamed request to the engine and settle it: the response
    body, or GatewayError (its hold released, nothing charged) when the engine did not serve
    it. ``on_settled(body)`` (synchronous) runs in the token charge's own transaction: what it
    writes commits with the charge or not at all (a batch item keeps its answer so)."""
    market = trace.market = admitted.market.slug
    metrics.IN_FLIGHT.labels(market).inc()
    metrics.WAITING.labels(market).inc()
    started = time.perf_counter()
    try:
        output = await engine_client().generate(
            base_url=admitted.market.engine_url,
            body=_body(admitted, params, stream=False),
            timeouts=engine_timeouts(),
        )
    except EngineError as exc:
        await shielded(released(admitted.request_id))
        raise _engine_failure(exc) from None
    except asyncio.CancelledError:  # the client went away before the answer
        detached(released(admitted.request_id))
        raise
    finally:
        metrics.WAITING.labels(market).dec()
        metrics.IN_FLIGHT.labels(market).dec()
    if (lost := _bid_lost(admitted, output.meta)) is not None:
        await shielded(released(admitted.request_id))
        raise lost
    metrics.TTFT.labels(market).observe(time.perf_counter() - started)
    if on_settled is None:
        settling = detached(_answered(params=params, admitted=admitted, output=output))
    else:  # settled alone, in one transaction with what on_settled writes
        settling = detached(
            db_call_retried(
                _settled_body,
                params=params,
                admitted=admitted,
                output=output,
                on_settled=on_settled,
            )
        )
    try:
        return await _settled_anyway(settling)
    except DatabaseUnavailable:  # not answered, so not charged: released when it is back
        detached(released(admitted.request_id))
        raise


async def _settled_anyway(settling: asyncio.Task[T]) -> T:
    """The result of ``settling``, the settlement of a complete answer, waited for even when
    this request is cancelled meanwhile: the server stopping (after its grace) then still sends
    the answer it charges; to a client gone, nothing is sent anyway. A second cancellation
    (the process exiting) is not waited out."""
    try:
        return await asyncio.shield(settling)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return await asyncio.shield(settling)


async def _answered(*, params: CompletionParams, admitted: Admitted, output: EngineOutput) -> dict:
    """Settle the request (in this process's batch) and build the response body."""
    settled = await _settled(
        request_id=admitted.request_id, meta=output.meta, market=admitted.market
    )
    return _completion_body(params=params, admitted=admitted, output=output, settled=settled)


def _completion_body(
    *, params: CompletionParams, admitted: Admitted, output: EngineOutput, settled: Settled
) -> dict:
    return responses.completion_body(
        **_shape(params, admitted),
        text=output.text,
        finish=responses.finish_reason(output.meta, max_tokens=params.max_tokens),
        usage=responses.usage_body(output.meta),
        auction=_auction(admitted, output.meta, settled),
    )


def _settled_body(
    *,
    params: CompletionParams,
    admitted: Admitted,
    output: EngineOutput,
    on_settled: Callable[[dict], None],
) -> dict:
    """Settle the request alone and build the response body (synchronous), both in one
    transaction with what ``on_settled`` writes."""
    with transaction.atomic():
        settled = _settle(request_id=admitted.request_id, meta=output.meta, market=admitted.market)
        body = _completion_body(params=params, admitted=admitted, output=output, settled=settled)
        on_settled(body)
    return body


async def completion_stream(
    *, params: CompletionParams, key: str | None, trace: Trace
) -> AsyncIterator[bytes]:
    """A streamed completion: admits and waits for the engine's first event (so refusals are
    still proper error answers), then returns the server-sent events to send."""
    admitted = await admitted_for(params, key, trace)
    market = trace.market
    metrics.IN_FLIGHT.labels(market).inc()
    metrics.WAITING.labels(market).inc()
    started = time.perf_counter()
    events = engine_client().generate_stream(
        base_url=admitted.market.engine_url,
        body=_body(admitted, params, stream=True),
        timeouts=engine_timeouts(),
    )
    try:
        first: EngineChunk | None = await anext(events, None)
    except EngineError as exc:
        metrics.IN_FLIGHT.labels(market).dec()
        await shielded(released(admitted.request_id))
        raise _engine_failure(exc) from None
    except asyncio.CancelledError:
        metrics.IN_FLIGHT.labels(market).dec()
        detached(_closed_and_failed(events, admitted.request_id))
        raise
    finally:
        metrics.WAITING.labels(market).dec()
    if first is not None and (lost := _bid_lost(admitted, first.meta)) is not None:
        metrics.IN_FLIGHT.labels(market).dec()
        await shielded(_closed_and_failed(events, admitted.request_id))
        raise lost
    metrics.TTFT.labels(market).observe(time.perf_counter() - started)
    # Start the event generator here: a started async generator that is dropped unfinished is
    # closed by the event loop (its finally settles), an unstarted one would never run at all.
    sse = _sse(params, admitted, events, first)
    return _prefixed(await anext(sse), sse)


async def _prefixed(head: bytes, rest: AsyncGenerator[bytes]) -> AsyncIterator[bytes]:
    """``head``, then what ``rest`` yields; closing this closes ``rest``."""
    try:
        yield head
        async for part in rest:
            yield part
    finally:
        await rest.aclose()


async def _closed_and_failed(events: AsyncIterator[EngineChunk], request_id: str) -> None:
    await events.aclose()  # type: ignore[attr-defined]
    await released(request_id)


async def _sse(
    params: CompletionParams,
    admitted: Admitted,
    events: AsyncIterator[EngineChunk],
    first: EngineChunk | None,
) -> AsyncGenerator[bytes]:
    """The events of a stream. Settles exactly once, whether the stream ends, the engine fails
    mid-way, or the client leaves (then the tokens sent so far are charged)."""
    shape = _shape(params, admitted)
    market = admitted.market.slug
    meta: EngineMeta | None = first.meta if first is not None else None
    settled = False

    async def settle() -> Settled | None:
        nonlocal settled
        settled = True
        if meta is None or (meta.completion_tokens == 0 and meta.finish_reason is None):
            await shielded(released(admitted.request_id))
            return None
        settling = {"request_id": admitted.request_id, "meta": meta, "market": admitted.market}
        try:
            return await shielded(_settled(**settling))
        except DatabaseUnavailable:  # the tokens were sent: charged once the database is back
            detached(_settled(within_s=settings.STALE_REQUEST_S, **settling))
            return None

    try:
        # The first event is yielded before anything is awaited (see completion_stream).
        if params.endpoint == CHAT:
            yield responses.sse(responses.chunk_body(**shape, role=True))
            if first is not None and first.delta:
                yield responses.sse(responses.chunk_body(**shape, text=first.delta))
        else:
            text = first.delta if first is not None else ""
            yield responses.sse(responses.chunk_body(**shape, text=text))
        try:
            async for chunk in events:
                meta = chunk.meta
                if chunk.delta:
                    yield responses.sse(responses.chunk_body(**shape, text=chunk.delta))
        except EngineError as exc:
            error = _engine_failure(exc, charged=await settle())
            metrics.ERRORS.labels(market, params.endpoint, str(error.status), error.code).inc()
            yield responses.sse(error.body())
            return
        auction = _auction(admitted, meta, await settle())
        finish = responses.finish_reason(meta, max_tokens=params.max_tokens)
        if params.include_usage and meta is not None:
            yield responses.sse(responses.chunk_body(**shape, finish=finish))
            extra = {"usage": responses.usage_body(meta), "auction": auction}
            yield responses.sse(responses.chunk_body(**shape, no_choices=True, extra=extra))
        else:
            yield responses.sse(
                responses.chunk_body(**shape, finish=finish, extra={"auction": auction})
            )
        yield responses.DONE
    finally:
        metrics.IN_FLIGHT.labels(market).dec()
        if not settled:  # the client left mid-stream
            settled = True
            detached(_left(events, settle))


async def _left(events: AsyncIterator[EngineChunk], settle) -> None:
    try:
        await events.aclose()  # type: ignore[attr-defined]
    finally:
        await settle()


async def models_list(*, key: str | None) -> dict:
    """``GET /v1/models`` for an authenticated key."""
    await db_call(api_key_authenticated, key=key)
    return {"object": "list", "data": await db_call(models_served)}


async def quote_read(*, key: str | None, params: QuoteQuery) -> dict:
    """``GET /v1/quotes`` for an authenticated key (``selectors.quote_for``)."""
    await db_call(api_key_authenticated, key=key)
    market = await db_call(market_for_model, model=params.model)
    if market is None:
        raise ModelNotFound(f"no market serves the model {params.model!r}", param="model")
    return await db_call(
        quote_for,
        market=market,
        ttft_s=params.ttft_s,
        probability=params.probability,
        bid=params.bid,
        prompt_tokens=params.prompt_tokens,
    )
