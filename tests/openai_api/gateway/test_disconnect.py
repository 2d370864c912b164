"""A client that goes away: charged for the tokens it was sent, once; or, before any token,
not charged at all and its hold released."""

from __future__ import annotations

import asyncio
import gc
import json
import threading

import httpx
import pytest

from accounts.models import ChargeKind, HoldState, Request, RequestStatus
from openai_api.gateway import db as gateway_db
from openai_api.gateway import services
from openai_api.gateway.validation import CHAT, completion_params
from tests.openai_api.conftest import market_create
from tests.openai_api.helpers import (
    HELLO,
    entries,
    hold,
    request_id_of,
    request_row,
    token_charge_by_hand,
    token_entry,
    wait_until,
)


def test_leaving_mid_stream_charges_the_tokens_sent_once(
    gateway, acme, start_sim, transactional_db
):
    sim = start_sim(speed=1.0)  # real time: 200 decode steps of ~4 ms
    market = market_create(engine_url=sim.url)
    body = {"model": market.served_model, "messages": HELLO, "max_tokens": 200, "stream": True}
    received = 0
    with acme.http(gateway) as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            rid = request_id_of(chunk["id"])
            received += 1
            if received == 4:  # the role chunk and three tokens
                break
    row = wait_until(lambda: (r := request_row(rid)).status != RequestStatus.QUEUED and r)
    assert row.status == RequestStatus.SERVED
    assert 3 <= row.completion_tokens < 200
    entry = token_entry(rid)  # and its priority charge (no bid: 0), settled with it
    assert {e.kind for e in entries(rid)} == {ChargeKind.TOKENS, ChargeKind.PRIORITY}
    assert entry.amount == token_charge_by_hand(
        prompt=16, cached=0, completion=row.completion_tokens
    )
    assert hold(rid).state == HoldState.SETTLED
    # the engine stops streaming to nobody: its connection was closed
    wait_until(lambda: sim.call(lambda: sim.server.loop.abandoned_outputs) == 1)


def test_leaving_before_any_token_charges_nothing(gateway, acme, start_sim, transactional_db):
    # One running request at a time, and a long one runs: ours waits in the queue.
    sim = start_sim(speed=1.0, settings=["max_running_requests=1"])
    market = market_create(engine_url=sim.url)

    def occupy() -> None:
        body = {"rid": "occupy", "text": "x", "sampling_params": {"max_new_tokens": 400}}
        try:
            httpx.post(f"{sim.url}/generate", json=body, timeout=30)
        except httpx.HTTPError:
            pass

    threading.Thread(target=occupy, daemon=True).start()
    wait_until(lambda: sim.call(lambda: len(sim.server.engine.running)) == 1)
    body = {"model": market.served_model, "messages": HELLO, "max_tokens": 5, "stream": True}
    with acme.http(gateway) as http:
        try:
            http.post("/v1/chat/completions", json=body, timeout=0.5)
        except httpx.ReadTimeout:
            pass  # gave up waiting for the first token
    (rid,) = wait_until(lambda: list(Request.objects.values_list("request_id", flat=True)))
    row = wait_until(lambda: (r := request_row(rid)).status != RequestStatus.QUEUED and r)
    assert row.status == RequestStatus.FAILED
    assert entries(rid) == []
    assert hold(rid).state == HoldState.RELEASED
    # the engine forgot the waiting request
    wait_until(lambda: sim.call(lambda: sim.server.loop.cancelled) == 1)


@pytest.mark.asyncio
async def test_a_stream_dropped_before_its_first_byte_is_settled_anyway(acme, market):
    # What happens when the server drops the response before sending any of it.
    body = {"model": market.served_model, "messages": HELLO, "max_tokens": 3, "stream": True}
    params = completion_params(body, endpoint=CHAT, headers={})
    trace = services.Trace(endpoint=CHAT)
    events = await services.completion_stream(params=params, key=acme.key, trace=trace)
    del events
    gc.collect()
    for _ in range(100):  # the loop closes the dropped generator, which settles in the background
        await asyncio.sleep(0.02)
        await gateway_db.background_drained()
        (row,) = await gateway_db.db_call(lambda: list(Request.objects.all()))
        if row.status != RequestStatus.QUEUED:
            break
    assert row.status in (RequestStatus.SERVED, RequestStatus.FAILED)
    held = await gateway_db.db_call(hold, request_id=row.request_id)
    assert held.state != HoldState.OPEN
    # Served, its two charges once each; failed, none.
    settled = await gateway_db.db_call(entries, request_id=row.request_id)
    assert len(settled) == (2 if row.status == RequestStatus.SERVED else 0)
