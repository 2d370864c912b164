"""An engine that freezes, stalls or cannot be reached, and a client that gives up (issue 12,
finding 7): the gateway answers within its timeouts (ENGINE_*_TIMEOUT_S), releases the hold and
charges nothing; a busy engine is still waited for; a client that leaves is not charged and its
engine call is cancelled.

The engines here are real servers on real ports (``fake_engines``, the simulated engine), the
gateway the real ASGI app under Daphne.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from accounts.models import HoldState, Request, RequestStatus
from engines.client import (
    EngineClient,
    EngineTimedOut,
    EngineUnavailable,
    generate_body,
)
from tests.openai_api.conftest import market_create
from tests.openai_api.fake_engines import stalled_engine, unaccepting_port
from tests.openai_api.helpers import (
    HELLO,
    entries,
    hold,
    request_id_of,
    request_row,
    token_charge_by_hand,
    wait_until,
)

SILENCE_S = 0.5  # ENGINE_READ_TIMEOUT_S in these tests
# A frozen engine is given up on after a silence and a failed health check: 2 x SILENCE_S.
# Today's client waited 600 s; a client of the gateway gives up after CLIENT_WAIT_S.
CLIENT_WAIT_S = 10.0


@pytest.fixture
def short_timeouts(settings):
    settings.ENGINE_CONNECT_TIMEOUT_S = 0.3
    settings.ENGINE_READ_TIMEOUT_S = SILENCE_S
    settings.ENGINE_ANSWER_TIMEOUT_S = 30.0
    return settings


def only_request_id() -> str:
    (rid,) = wait_until(lambda: list(Request.objects.values_list("request_id", flat=True)))
    return rid


def assert_failed_uncharged(rid: str) -> None:
    row = wait_until(lambda: (r := request_row(rid)).status != RequestStatus.QUEUED and r)
    assert row.status == RequestStatus.FAILED
    assert entries(rid) == []
    assert hold(rid).state == HoldState.RELEASED


def chat_body(market, **extra) -> dict:
    return {"model": market.served_model, "messages": HELLO, "max_tokens": 5, **extra}


# --- the gateway, engine frozen, stalled, unreachable ---------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_frozen_engine_is_a_504_within_the_timeout_and_charges_nothing(
    gateway, acme, short_timeouts, stream, transactional_db
):
    with stalled_engine("frozen") as engine:
        market = market_create(engine_url=engine.url)
        started = time.monotonic()
        with acme.http(gateway) as http:
            response = http.post(
                "/v1/chat/completions",
                json=chat_body(market, stream=stream),
                timeout=CLIENT_WAIT_S,
            )
        elapsed = time.monotonic() - started
        assert response.status_code == 504, response.text
        assert response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("service_unavailable", "engine_timeout")
        assert "not charged" in error["message"]
        assert elapsed < 4 * SILENCE_S + 1.0  # a silence, a failed check, and some slack
        assert_failed_uncharged(only_request_id())
        # it asked the engine's health before giving up, then dropped the request
        assert "/health_generate" in engine.paths
        wait_until(lambda: engine.generate_closed == 1)


def test_an_engine_that_stalls_mid_stream_ends_the_stream_with_a_timeout(
    gateway, acme, short_timeouts, transactional_db
):
    with stalled_engine("stalls") as engine:
        market = market_create(engine_url=engine.url)
        events: list[dict] = []
        started = time.monotonic()
        with (
            acme.http(gateway) as http,
            http.stream(
                "POST",
                "/v1/chat/completions",
                json=chat_body(market, stream=True),
                timeout=CLIENT_WAIT_S,
            ) as response,
        ):
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
        elapsed = time.monotonic() - started
        assert elapsed < 2 * SILENCE_S + 1.0  # once streaming, a silence alone is a failure
        deltas = [e["choices"][0]["delta"] for e in events[:-1]]
        assert deltas[0]["role"] == "assistant"  # the role chunk, then the one token sent
        assert [d.get("content") for d in deltas] == ["", "Hi"]
        error = events[-1]["error"]
        assert error["code"] == "engine_timeout" and "mid-answer" in error["message"]
        # It tells the truth: what it was sent is charged.
        # 16 x $3 + 1 x $15 per million = $0.000063, shown to its (two) significant digits.
        assert "the tokens sent were charged ($0.000063)" in error["message"]
        assert "not charged" not in error["message"]
        rid = request_id_of(events[0]["id"])
        # The one token it was sent is charged, once (as for any stream cut mid-way), no more.
        (entry,) = wait_until(lambda: entries(rid))  # no priority: the engine reported none
        assert entry.amount == token_charge_by_hand(prompt=16, cached=0, completion=1)
        assert hold(rid).state == HoldState.SETTLED
        wait_until(lambda: engine.generate_closed == 1)


def test_an_unreachable_engine_is_a_503_after_the_connect_timeout(
    gateway, acme, short_timeouts, transactional_db
):
    with unaccepting_port() as port:
        market = market_create(engine_url=f"http://127.0.0.1:{port}")
        started = time.monotonic()
        with acme.http(gateway) as http:
            response = http.post(
                "/v1/chat/completions", json=chat_body(market), timeout=CLIENT_WAIT_S
            )
        elapsed = time.monotonic() - started
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "engine_unavailable"
    assert elapsed < 1.5  # ENGINE_CONNECT_TIMEOUT_S = 0.3 (the old client waited 2 s)
    assert_failed_uncharged(only_request_id())


@pytest.mark.parametrize("stream", [False, True])
def test_a_busy_engine_is_waited_for_longer_than_the_silence(
    gateway, acme, start_sim, settings, stream, transactional_db
):
    # One running request at a time and a long one running: ours waits in the queue, silent,
    # for several ENGINE_READ_TIMEOUT_S; the engine passes its health checks, so it is served.
    settings.ENGINE_READ_TIMEOUT_S = 0.2
    sim = start_sim(speed=1.0, settings=["max_running_requests=1"])
    market = market_create(engine_url=sim.url)
    occupied = threading.Thread(target=_occupy, args=(sim.url, 300), daemon=True)
    occupied.start()
    wait_until(lambda: sim.call(lambda: len(sim.server.engine.running)) == 1)
    started = time.monotonic()
    with acme.http(gateway) as http:
        response = http.post("/v1/chat/completions", json=chat_body(market, stream=stream))
    assert response.status_code == 200, response.text
    assert time.monotonic() - started > 3 * 0.2  # it did wait past several silences
    rid = only_request_id()
    assert request_row(rid).status == RequestStatus.SERVED
    assert len(entries(rid)) == 2  # its tokens and its priority, once each
    occupied.join(timeout=15)


def _occupy(url: str, tokens: int) -> None:
    body = {"rid": "occupy", "text": "x", "sampling_params": {"max_new_tokens": tokens}}
    try:
        httpx.post(f"{url}/generate", json=body, timeout=30)
    except httpx.HTTPError:
        pass


# --- a client that gives up before anything is sent ------------------------------------------


def test_a_client_that_hangs_up_while_the_engine_is_frozen_is_not_charged(
    gateway, acme, transactional_db
):
    # The default timeouts (30 s of silence) have not fired: the client leaves first, over a
    # raw socket that sends the request and closes.
    with stalled_engine("frozen") as engine:
        market = market_create(engine_url=engine.url)
        payload = json.dumps(chat_body(market)).encode()
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as client:
            client.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                + f"Authorization: Bearer {acme.key}\r\n".encode()
                + b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            wait_until(lambda: "/generate" in engine.paths)  # the engine has the request
        assert_failed_uncharged(only_request_id())
        wait_until(lambda: engine.generate_closed == 1)  # the engine call was cancelled


def test_a_client_that_gives_up_while_its_request_is_queued_is_not_charged(
    gateway, acme, start_sim, transactional_db
):
    sim = start_sim(speed=1.0, settings=["max_running_requests=1"])
    market = market_create(engine_url=sim.url)
    threading.Thread(target=_occupy, args=(sim.url, 400), daemon=True).start()
    wait_until(lambda: sim.call(lambda: len(sim.server.engine.running)) == 1)
    with acme.http(gateway) as http, pytest.raises(httpx.ReadTimeout):
        http.post("/v1/chat/completions", json=chat_body(market), timeout=0.5)
    assert_failed_uncharged(only_request_id())
    # the engine forgot the waiting request: the gateway's call to it was cancelled
    wait_until(lambda: sim.call(lambda: sim.server.loop.cancelled) == 1)


# --- the engine client itself ----------------------------------------------------------------


def _body(rid: str) -> dict:
    return generate_body(rid=rid, max_new_tokens=3, bid=0.0, text="Hello")


@pytest.mark.asyncio
async def test_the_client_gives_up_on_a_frozen_engine_after_a_failed_health_check():
    client = EngineClient(read_timeout_s=0.3, answer_timeout_s=30)
    with stalled_engine("frozen") as engine:
        try:
            started = time.monotonic()
            with pytest.raises(EngineTimedOut, match="health check"):
                await client.generate(base_url=engine.url, body=_body("f1"))
            with pytest.raises(EngineTimedOut, match="health check"):
                await anext(client.generate_stream(base_url=engine.url, body=_body("f2")))
            assert time.monotonic() - started < 2 * (2 * 0.3) + 1.0
        finally:
            await client.aclose()


@pytest.mark.asyncio
async def test_a_healthy_engine_that_never_answers_is_given_up_on_at_the_answer_timeout():
    client = EngineClient(read_timeout_s=0.2, answer_timeout_s=1.0)
    with stalled_engine("healthy") as engine:
        try:
            started = time.monotonic()
            waits = [client.generate(base_url=engine.url, body=_body(f"h{i}")) for i in range(5)]
            outcomes = await asyncio.gather(*waits, return_exceptions=True)
            elapsed = time.monotonic() - started
        finally:
            await client.aclose()
    assert all(isinstance(o, EngineTimedOut) for o in outcomes), outcomes
    assert all("did not begin to answer in 1 s" in o.message for o in outcomes)
    assert 1.0 <= elapsed < 2.5
    # The five waits shared their health checks: one at a time, each good for 0.1 s; five
    # requests checking every 0.2 s on their own would have made about 5 x 4 = 20.
    checks = engine.paths.count("/health_generate")
    assert 1 <= checks <= 8, checks


@pytest.mark.asyncio
async def test_connecting_times_out_as_unavailable_not_as_a_silence():
    client = EngineClient(connect_timeout_s=0.3, read_timeout_s=30)
    with unaccepting_port() as port:
        try:
            started = time.monotonic()
            with pytest.raises(EngineUnavailable) as caught:
                await client.generate(base_url=f"http://127.0.0.1:{port}", body=_body("u1"))
            assert time.monotonic() - started < 1.5
        finally:
            await client.aclose()
    assert not isinstance(caught.value, EngineTimedOut)
