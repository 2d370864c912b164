"""Every error status of docs/api.md, "Errors", through the running server, with OpenAI-style
bodies; and
what each leaves behind: no charge, no open hold."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, time, timedelta

import httpx
import openai
import pytest

from accounts.models import Hold, HoldState, LedgerEntry, Request, RequestStatus
from accounts.services import api_key_create, api_key_revoke, budget_set
from tests.conftest import dead_port
from tests.openai_api.conftest import market_create
from tests.openai_api.helpers import HELLO, wait_until


def error_of(response: httpx.Response, status: int, *extra: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code", *extra}
    assert error["message"]
    return error


def chat(http: httpx.Client, market, **body) -> httpx.Response:
    return http.post(
        "/v1/chat/completions",
        json={"model": market.served_model, "messages": HELLO, "max_tokens": 2, **body},
    )


def assert_nothing_charged_or_held() -> None:
    assert not LedgerEntry.objects.exists()
    assert not Hold.objects.filter(state=HoldState.OPEN).exists()


# --- 401 --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer im_nope_nope", "Basic abc", "Bearer not-a-key-at-all"],
)
def test_401_for_a_missing_or_bad_key(gateway, market, authorization, transactional_db):
    headers = {} if authorization is None else {"Authorization": authorization}
    with httpx.Client(base_url=gateway.url, headers=headers) as http:
        error = error_of(chat(http, market), 401)
        assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
        assert error_of(http.get("/v1/models"), 401)["code"] == "invalid_api_key"
    assert not Request.objects.exists()


def test_401_for_a_revoked_key_with_the_openai_client(gateway, acme, market):
    revoked, key = api_key_create(tenant=acme.tenant, name="old", created_by=None)
    api_key_revoke(api_key=revoked)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model=market.served_model, messages=HELLO)
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"


# --- 400 and 422 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'"a string"', None),
        (b"\xff\xfe", None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": 5, "messages": []}', "model"),
        (b'{"model": "m"}', "messages"),
        (b'{"model": "m", "messages": "hi"}', "messages"),
        (b'{"model": "m", "messages": ["hi"]}', "messages[0]"),
        (b'{"model": "m", "messages": [{"content": "x"}]}', "messages[0].role"),
        (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        (b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": "5"}', "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": 2.5}', "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}', "stream"),
        (b'{"model": "m", "messages": [{"role": "user"}], "bid": true}', "bid"),
        (b'{"model": "m", "messages": [{"role": "user"}], "bid": [1]}', "bid"),
        (b'{"model": "m", "messages": [{"role": "user"}], "temperature": "hot"}', "temperature"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stop": 5}', "stop"),
    ],
)
def test_400_for_a_malformed_body(gateway, acme, body, param):
    with acme.http(gateway) as http:
        response = http.post(
            "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
        )
        error = error_of(response, 400)
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "malformed_request",
        param,
    )


@pytest.mark.parametrize(
    ("fields", "headers", "param"),
    [
        ({"bid": -1}, {}, "bid"),
        ({"bid": "-0.5"}, {}, "bid"),
        ({"bid": "NaN"}, {}, "bid"),
        ({"bid": "Infinity"}, {}, "bid"),
        ({"bid": "1e400"}, {}, "bid"),
        ({"bid": "0.0000000001"}, {}, "bid"),  # 10 decimal places
        ({"bid": 1000001}, {}, "bid"),
        ({"bid": "ten dollars"}, {}, "bid"),
        ({}, {"X-Bid": "abc"}, "X-Bid"),
        ({}, {"X-Bid": "-3"}, "X-Bid"),
        ({"bid": "0.1"}, {"X-Bid": "0.2"}, "bid"),
        ({"max_tokens": 0}, {}, "max_tokens"),
        ({"max_tokens": 10**6}, {}, "max_tokens"),
        ({"max_completion_tokens": -1}, {}, "max_completion_tokens"),
        ({"messages": []}, {}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, {}, "messages[0].role"),
        ({"n": 2}, {}, "n"),
        ({"temperature": 9}, {}, "temperature"),
        ({"model": " "}, {}, "model"),
        ({"tools": [{"type": "function"}]}, {}, "tools"),
        ({}, {"X-Request-Class": "no spaces please"}, "X-Request-Class"),
    ],
)
def test_422_for_an_invalid_value(gateway, acme, market, fields, headers, param):
    with acme.http(gateway) as http:
        body = {"model": market.served_model, "messages": HELLO, **fields}
        error = error_of(http.post("/v1/chat/completions", json=body, headers=headers), 422)
    assert (error["code"], error["param"]) == ("invalid_value", param)
    assert not Request.objects.exists()


def test_422_for_a_nan_bid_literal(gateway, acme, market):
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "bid": NaN}'
    with acme.http(gateway) as http:
        response = http.post("/v1/chat/completions", content=body % market.served_model.encode())
        assert error_of(response, 422)["param"] == "bid"


def test_422_for_an_empty_prompt_with_the_openai_client(gateway, acme, market):
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        acme.client(gateway).completions.create(model=market.served_model, prompt="")
    assert caught.value.status_code == 422


def test_400_with_the_engines_message_when_the_engine_refuses(
    gateway, acme, start_sim, transactional_db
):
    sim = start_sim(settings=["kv_capacity_tokens=64"])
    market = market_create(engine_url=sim.url)
    with acme.http(gateway) as http:
        error = error_of(chat(http, market, max_tokens=500), 400)
    assert error["code"] == "engine_rejected"
    assert "can never fit" in error["message"]
    (request,) = Request.objects.all()
    assert request.status == RequestStatus.FAILED
    assert_nothing_charged_or_held()


# --- 404, 405 ---------------------------------------------------------------------------------


def test_429_insufficient_quota_when_the_budget_is_exhausted(gateway, acme, market):
    budget_set(tenant=acme.tenant, limit="0.0003", period="day")
    with acme.http(gateway) as http:
        answer = chat(http, market, max_tokens=20)  # no bid: a hold of its tokens only
    error = error_of(answer, 429, "budget")  # OpenAI's four fields, and the figures
    assert (error["code"], error["type"]) == ("insufficient_quota", "insufficient_quota")
    # Not a transient: OpenAI's clients are told not to retry, and no Retry-After invites it.
    assert answer.headers["x-should-retry"] == "false"
    assert "Retry-After" not in answer.headers
    # The worst case: 16 x $3 + 20 x $15 per million = $0.000348 > the $0.0003 left of the
    # day's budget (three significant digits: $0.0003, $0.000348); it resets at the next
    # 00:00 UTC, in whole hours and minutes (or minutes and seconds), floored.
    now = datetime.now(UTC)
    midnight = datetime.combine(now.date() + timedelta(days=1), time(), tzinfo=UTC)
    message = error["message"]
    assert message.startswith(
        "This request's hold, up to $0.000348, is more than the $0.0003 left of the tenant's "
        "budget of $0.0003 per day ($0.00 spent, $0.00 held for requests in flight); it is "
        "more than the whole budget, so the reset will not make room. The hold is the prompt "
        "and max_tokens at the market's prices plus the bid times the market's hold horizon: "
        "lower the bid or max_tokens, or raise the budget. "
        f"It resets at {midnight.isoformat()} (in "
    )
    budget = error["budget"]
    assert budget == {
        "reason": "exceeds_remaining",
        "budget_id": budget["budget_id"],
        "scope": "tenant",
        "period": "day",
        "limit": "0.000300000",
        "spent": "0.000000000",
        "held": "0.000000000",
        "remaining": "0.000300000",
        "needed": "0.000348000",
        "resets_at": midnight.isoformat(),
        "seconds_until_reset": budget["seconds_until_reset"],
    }
    with acme.http(gateway) as http:
        listed = http.get("/v1/budgets").json()["data"]
    assert [b["budget_id"] for b in listed] == [budget["budget_id"]]
    assert 0 < budget["seconds_until_reset"] <= 86400
    until = re.search(r"\(in ([^)]+)\)\.$", message).group(1)
    assert re.fullmatch(r"(\d+ h( \d+ min)?|\d+ min( \d+ s)?|[\d.]+ s)", until), until
    unit_s = {"h": 3600, "min": 60, "s": 1}
    seconds = sum(float(n) * unit_s[u] for n, u in re.findall(r"([\d.]+) (h|min|s)", until))
    assert -5 < (midnight - now).total_seconds() - seconds < 60 + 5  # floored to the minute
    assert not Request.objects.exists()
    assert not Hold.objects.exists()


def test_429_a_first_bid_whose_hold_is_larger_than_a_fresh_budget_says_so(gateway, acme, market):
    """Issue 48, item 4: a fresh $0.002/day key, a first request bidding 0.05 $/s. Its hold,
    mostly the bid x the hold horizon, is more than the whole budget: nothing is exhausted, and
    the answer says what to do, in its message and in figures."""
    market.hold_horizon_s = 0.25
    market.save(update_fields=["hold_horizon_s"])
    budget_set(tenant=acme.tenant, api_key=acme.api_key, limit="0.002", period="day")
    with acme.http(gateway) as http:
        answer = chat(http, market, max_tokens=20, bid="0.05")
    error = error_of(answer, 429, "budget")
    assert (error["code"], error["type"], error["param"]) == (
        "insufficient_quota",
        "insufficient_quota",
        None,
    )
    # 16 x $3 + 20 x $15 per million = $0.000348 for the tokens, 0.05 $/s x 0.25 s = $0.0125
    # for the bid: $0.012848 held, of a $0.002 budget untouched.
    assert error["message"].startswith(
        "This request's hold, up to $0.0128, is more than the $0.002 left of this API key's "
        "budget of $0.002 per day ($0.00 spent, $0.00 held for requests in flight); it is more "
        "than the whole budget, so the reset will not make room. The hold is the prompt and "
        "max_tokens at the market's prices plus the bid times the market's hold horizon: lower "
        "the bid or max_tokens, or raise the budget. It resets at "
    )
    assert "exhausted" not in error["message"]
    budget = error["budget"]
    assert (budget["reason"], budget["scope"], budget["period"]) == (
        "exceeds_remaining",
        "key",
        "day",
    )
    assert (budget["limit"], budget["spent"], budget["held"], budget["remaining"]) == (
        "0.002000000",
        "0.000000000",
        "0.000000000",
        "0.002000000",
    )
    assert budget["needed"] == "0.012848000"
    with acme.http(gateway) as http:  # a bid the budget holds is served
        assert chat(http, market, max_tokens=20, bid="0.005").status_code == 200
    assert Request.objects.filter(status=RequestStatus.SERVED).count() == 1


def test_404_for_an_unknown_model(gateway, acme, market):
    with pytest.raises(openai.NotFoundError) as caught:
        acme.client(gateway).chat.completions.create(model="org/no-such-model", messages=HELLO)
    assert caught.value.body["code"] == "model_not_found"
    assert caught.value.body["param"] == "model"


def test_405_for_the_wrong_method(gateway, acme):
    with acme.http(gateway) as http:
        assert error_of(http.get("/v1/chat/completions"), 405)["code"] == "method_not_allowed"
        assert error_of(http.post("/v1/models"), 405)["code"] == "method_not_allowed"


# --- 429 and 503 ------------------------------------------------------------------------------


def test_429_with_retry_after_when_the_engine_queue_is_full(
    gateway, acme, start_sim, transactional_db
):
    # One request runs (a long generation), one waits (one running request at most), and with
    # room for one waiting request the next is refused.
    sim = start_sim(speed=1.0, max_queue=1, settings=["max_running_requests=1"])
    market = market_create(engine_url=sim.url)

    def occupy(rid: str) -> None:
        body = {"rid": rid, "text": "occupy", "sampling_params": {"max_new_tokens": 400}}
        try:
            httpx.post(f"{sim.url}/generate", json=body, timeout=30)
        except httpx.HTTPError:
            pass  # the engine stops under it at the end of the test

    # One after the other: sent together, the second could find the first still waiting.
    threading.Thread(target=occupy, args=("running",), daemon=True).start()
    wait_until(lambda: sim.call(lambda: len(sim.server.engine.running)) == 1)
    threading.Thread(target=occupy, args=("waiting",), daemon=True).start()
    wait_until(lambda: len(sim.call(lambda: list(sim.server.engine.waiting))) == 1)
    with pytest.raises(openai.RateLimitError) as caught:
        acme.client(gateway).chat.completions.create(model=market.served_model, messages=HELLO)
    assert caught.value.status_code == 429
    assert caught.value.response.headers["Retry-After"] == "1"
    assert caught.value.body["code"] == "queue_full"
    (request,) = Request.objects.all()
    assert request.status == RequestStatus.FAILED
    assert Hold.objects.get(request_id=request.request_id).state == HoldState.RELEASED
    assert_nothing_charged_or_held()


@pytest.mark.parametrize("stream", [False, True])
def test_503_when_the_engine_is_down_and_nothing_is_charged(
    gateway, acme, stream, transactional_db
):
    market = market_create(engine_url=f"http://127.0.0.1:{dead_port()}")
    with pytest.raises(openai.InternalServerError) as caught:
        acme.client(gateway).chat.completions.create(
            model=market.served_model, messages=HELLO, stream=stream, extra_body={"bid": "0.2"}
        )
    assert caught.value.status_code == 503
    assert caught.value.body["code"] == "engine_unavailable"
    (request,) = Request.objects.all()
    assert request.status == RequestStatus.FAILED
    placed = Hold.objects.get(request_id=request.request_id)
    assert (placed.state, placed.remaining) == (HoldState.RELEASED, 0)
    assert_nothing_charged_or_held()


def test_503_when_the_chat_template_cannot_be_loaded(
    gateway, acme, sim, transactional_db, monkeypatch
):
    market = market_create(engine_url=sim.url)
    market.chat_template = "org/a-model-whose-tokenizer-is-not-here"
    market.save()
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)  # not installed
    with acme.http(gateway) as http:
        error = error_of(chat(http, market), 503)
    assert error["code"] == "chat_template_unavailable"
    assert not Request.objects.exists()
