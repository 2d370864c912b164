"""The running gateway (Daphne, the simulated engine, PostgreSQL) answers as the document says:
each operation's 200 body validates against its schema (streams event by event, batch result
files line by line), each documented error code is produced by a real request with its
documented status and a body its operation lists, the methods an operation does not document
are 405, and the document and its rendered page are served."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from django.db import InterfaceError

from accounts.services import budget_set
from openai_api.batches.tasks import batch_run
from openai_api.gateway import admission, services
from openai_api.openapi.document import ERROR_CODES, ErrorCode, openapi_document
from tests.conftest import dead_port
from tests.openai_api.batches.batch_helpers import (
    batch_of,
    batch_queue,  # noqa: F401 (fixture)
    completion_line,
    jsonl,
    prompt_of,
)
from tests.openai_api.conftest import market_create
from tests.openai_api.fake_engines import bid_dropping_route, stalled_engine
from tests.openai_api.helpers import HELLO, lock_timeout, wait_until
from tests.openai_api.openapi.schema_check import (
    checked,
    component,
    problems,
    schema_of,
    sse_events,
)

pytestmark = [pytest.mark.usefixtures("batch_queue")]

JSONL = {"Content-Type": "application/jsonl"}
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"


def _chat(market, **extra) -> dict:
    return {"model": market.served_model, "messages": HELLO, "max_tokens": 3, **extra}


# --- 200s ---------------------------------------------------------------------------------------


def test_completions_answer_as_documented(gateway, acme, market):
    with acme.http(gateway) as http:
        chat = checked(http.post(CHAT, json=_chat(market, bid="0.01")), CHAT)
        text = checked(
            http.post(
                TEXT,
                json={
                    "model": market.served_model,
                    "prompt": [5, 6, 7],
                    "max_tokens": 2,
                    "service_tier": "flex",
                },
            ),
            TEXT,
        )
        tiered = checked(
            http.post(CHAT, json=_chat(market, service_tier="priority"), headers={"X-Bid": "0"}),
            CHAT,
        )
    assert (chat["object"], chat["auction"]["bid"], chat["service_tier"]) == (
        "chat.completion",
        "0.010000000",
        "default",
    )
    assert (text["object"], text["service_tier"], text["auction"]["bid_source"]) == (
        "text_completion",
        "flex",
        "tier",
    )
    assert tiered["auction"]["bid_source"] == "explicit"  # X-Bid wins over the tier


@pytest.mark.parametrize(
    ("path", "body", "chunk"),
    [
        (CHAT, {"messages": HELLO}, "ChatCompletionChunk"),
        (TEXT, {"prompt": "Hello there"}, "TextCompletionChunk"),
    ],
)
def test_streams_answer_as_documented(gateway, acme, market, path, body, chunk):
    body = {
        "model": market.served_model,
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
        "bid": 0.02,
        **body,
    }
    with acme.http(gateway) as http:
        answer = http.post(path, json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert "text/event-stream" in schema_of_media(path)
    events = sse_events(answer.text)
    assert len(events) >= 3
    for event in events:
        assert not problems(event, component(chunk)), event
    assert events[-1]["auction"]["bid"] == "0.020000000" and events[-1]["usage"]


def schema_of_media(path: str) -> dict:
    return openapi_document()["paths"][path]["post"]["responses"]["200"]["content"]


def test_reads_answer_as_documented(gateway, acme, market):
    with acme.http(gateway) as http:
        models = checked(http.get("/v1/models"), "/v1/models")
        budgets = checked(http.get("/v1/budgets"), "/v1/budgets")
        quote = checked(
            http.get(
                "/v1/quotes", params={"model": market.served_model, "ttft_s": 2, "bid": "0.01"}
            ),
            "/v1/quotes",
        )
        http.post(CHAT, json=_chat(market, bid="0.01"))
        served = checked(
            http.get("/v1/quotes", params={"model": market.served_model, "bid": "0.01"}),
            "/v1/quotes",
        )
        now = int(time.time())  # the served request's minute, and the next
        window = {"start_time": now - 60, "end_time": now + 60, "group_by": "model,api_key_id",
                  "bucket_width": "1m"}  # fmt: skip
        usage = checked(
            http.get("/v1/organization/usage/completions", params=window),
            "/v1/organization/usage/completions",
        )
        costs = checked(
            http.get("/v1/organization/costs", params={**window, "group_by": "line_item"}),
            "/v1/organization/costs",
        )
    assert market.served_model in [m["id"] for m in models["data"]]
    assert [b["period"] for b in budgets["data"]] == ["month"]  # acme's budget
    assert quote["bid"] is None and quote["reason"]  # nothing served yet
    assert served["based_on"]["requests"] >= 1
    # The served request's minute: one result of the key and model, and its two charges.
    (bucket,) = [b for b in usage["data"] if b["results"]]
    assert [(r["model"], r["num_model_requests"]) for r in bucket["results"]] == [
        (market.served_model, 1)
    ]
    assert {r["line_item"] for b in costs["data"] for r in b["results"]} <= {"tokens", "priority"}


def test_batches_answer_as_documented(gateway, acme, market):
    lines = [
        completion_line(
            f"q{i}", market.served_model, prompt=prompt_of(i, 3), max_tokens=2, bid=0.01
        )
        for i in range(2)
    ]
    lines.append(
        completion_line("big", market.served_model, prompt=prompt_of(9, 3), max_tokens=2, bid=0.01)
    )
    with acme.http(gateway) as http:
        batch = checked(
            http.post("/v1/batches", content=jsonl(lines), headers=JSONL), "/v1/batches"
        )
        checked(
            http.post("/v1/batches", json={"input": jsonl(lines), "metadata": {"a": "b"}}),
            "/v1/batches",
        )
        page = checked(http.get("/v1/batches", params={"limit": 1}), "/v1/batches")
        assert page["has_more"] is True
        batch_run.apply(args=[batch_of(batch["id"]).pk]).get()
        one = f"/v1/batches/{batch['id']}"
        done = checked(http.get(one), "/v1/batches/{batch_id}")
        assert done["status"] == "completed" and done["request_counts"]["completed"] == 3
        output = http.get(f"{one}/output")
        assert output.headers["content-type"].startswith("application/jsonl")
        rows = [json.loads(row) for row in output.text.splitlines()]
        assert len(rows) == 3
        for row in rows:
            assert not problems(row, component("BatchResultLine")), row
            assert not problems(row["response"]["body"], component("TextCompletion"))
        assert http.get(f"{one}/errors").text == ""


def test_the_document_and_its_page_are_served(gateway, transactional_db):
    with httpx.Client(base_url=gateway.url) as http:  # no key
        served = checked(http.get("/v1/openapi.json"), "/v1/openapi.json")
        page = http.get("/docs/api/")
        bundle = http.get("/static/drf_spectacular_sidecar/redoc/bundles/redoc.standalone.js")
    assert served == json.loads(json.dumps(openapi_document()))
    assert page.status_code == 200
    assert 'spec-url="/v1/openapi.json"' in page.text
    assert "/static/drf_spectacular_sidecar/redoc/bundles/redoc.standalone.js" in page.text
    assert "https://" not in page.text  # nothing from a CDN
    assert bundle.status_code == 200 and len(bundle.content) > 500_000


def test_undocumented_methods_are_405(gateway, acme):
    with acme.http(gateway) as http:
        for path, operations in openapi_document()["paths"].items():
            url = path.replace("{batch_id}", "batch_none")
            for method in {"get", "post", "put", "delete", "patch"} - set(operations):
                answer = http.request(method.upper(), url)
                assert answer.status_code == 405, (method, url)
                assert not problems(
                    answer.json(), schema_of(path, "get" if "get" in operations else "post", 405)
                )


def test_the_official_client_gets_the_tier_echoed_in_a_documented_answer(gateway, acme, market):
    client = acme.client(gateway)
    for tier in ("flex", "priority"):
        raw = client.chat.completions.with_raw_response.create(
            model=market.served_model, messages=HELLO, max_tokens=2, service_tier=tier
        )
        reply = raw.parse()
        assert reply.service_tier == tier
        assert not problems(raw.http_response.json(), component("ChatCompletion"))


# --- every error code -------------------------------------------------------------------------


@dataclass
class World:
    gateway: Any
    acme: Any
    sim: Any
    start_sim: Callable[..., Any]
    settings: Any
    monkeypatch: pytest.MonkeyPatch

    def market(self, **fields):
        market = market_create(engine_url=fields.pop("engine_url", self.sim.url))
        for name, value in fields.items():
            setattr(market, name, value)
        market.save()
        return market

    def post(self, path: str, **kwargs) -> httpx.Response:
        with self.acme.http(self.gateway) as http:
            return http.post(path, **kwargs)

    def get(self, path: str, **kwargs) -> httpx.Response:
        with self.acme.http(self.gateway) as http:
            return http.get(path, **kwargs)


def _queue_full(w: World):
    sim = w.start_sim(speed=1.0, max_queue=1, settings=["max_running_requests=1"])
    market = w.market(engine_url=sim.url)

    def occupy(rid: str) -> None:
        body = {"rid": rid, "text": "occupy", "sampling_params": {"max_new_tokens": 400}}
        try:
            httpx.post(f"{sim.url}/generate", json=body, timeout=30)
        except httpx.HTTPError:
            pass  # the engine stops under it at the end of the test

    threading.Thread(target=occupy, args=("running",), daemon=True).start()
    wait_until(lambda: sim.call(lambda: len(sim.server.engine.running)) == 1)
    threading.Thread(target=occupy, args=("waiting",), daemon=True).start()
    wait_until(lambda: len(sim.call(lambda: list(sim.server.engine.waiting))) == 1)
    return w.post(CHAT, json=_chat(market)), CHAT


def _engine_rejected(w: World):
    market = w.market(engine_url=w.start_sim(settings=["kv_capacity_tokens=64"]).url)
    return w.post(CHAT, json=_chat(market, max_tokens=500)), CHAT


def _bid_lost(w: World):
    with bid_dropping_route(w.sim.url) as route:
        return w.post(CHAT, json=_chat(w.market(engine_url=route.url), bid=0.5)), CHAT


def _timeout(w: World):
    w.settings.ENGINE_CONNECT_TIMEOUT_S = 0.3
    w.settings.ENGINE_READ_TIMEOUT_S = 0.5
    with stalled_engine("frozen") as engine:
        return w.post(CHAT, json=_chat(w.market(engine_url=engine.url)), timeout=10), CHAT


def _template(w: World):
    w.monkeypatch.setitem(__import__("sys").modules, "transformers", None)  # not installed
    market = w.market(chat_template="org/a-model-whose-tokenizer-is-not-here")
    return w.post(CHAT, json=_chat(market)), CHAT


def _admit_raising(exc: Exception) -> Callable[[World], Any]:
    def produce(w: World):
        def admit(**kwargs):
            raise exc

        w.monkeypatch.setattr(admission, "request_admit", admit)
        return w.post(CHAT, json=_chat(w.market())), CHAT

    return produce


def _internal(w: World):
    def broken(**kwargs):
        raise RuntimeError("a bug")

    w.monkeypatch.setattr(services, "models_list", broken)
    return w.get("/v1/models"), "/v1/models"


def _quota(w: World):
    budget_set(tenant=w.acme.tenant, limit="0.0003", period="day")
    return w.post(CHAT, json=_chat(w.market(), max_tokens=20)), CHAT


def _too_large(w: World):
    w.settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    return w.post(CHAT, json=_chat(w.market(), user="x" * 2000)), CHAT


def _batch_too_large(w: World):
    w.settings.BATCH_MAX_BYTES = 1000
    return w.post("/v1/batches", content="x" * 1001, headers=JSONL), "/v1/batches"


def _bad_batch(status: int) -> Callable[[World], Any]:
    def produce(w: World):
        line = completion_line("q", w.market().served_model, prompt=[1, 2], max_tokens=2)
        bad = "{not json\n" if status == 400 else jsonl([{**line, "method": "GET"}])
        return w.post("/v1/batches", content=bad, headers=JSONL), "/v1/batches"

    return produce


def _not_cancellable(w: World):
    batch = w.post(
        "/v1/batches",
        content=jsonl([completion_line("q", w.market().served_model, prompt=[1, 2], max_tokens=2)]),
        headers=JSONL,
    ).json()
    w.post(f"/v1/batches/{batch['id']}/cancel")
    return w.post(f"/v1/batches/{batch['id']}/cancel"), "/v1/batches/{batch_id}/cancel"


def _host(w: World):
    w.settings.ALLOWED_HOSTS = ["127.0.0.1"]
    return w.get("/v1/models", headers={"Host": "elsewhere.example"}), "/v1/models"


PRODUCERS: dict[tuple[str, int], Callable[[World], tuple[httpx.Response, str | None]]] = {
    ("malformed_request", 400): lambda w: (w.post(CHAT, content=b"{not json"), CHAT),
    ("invalid_host", 400): _host,
    ("engine_rejected", 400): _engine_rejected,
    ("invalid_batch_input", 400): _bad_batch(400),
    ("invalid_batch_input", 422): _bad_batch(422),
    ("invalid_api_key", 401): lambda w: (httpx.get(f"{w.gateway.url}/v1/budgets"), "/v1/budgets"),
    ("unknown_url", 404): lambda w: (w.get("/v1/embeddings"), None),
    ("model_not_found", 404): lambda w: (
        w.get("/v1/quotes", params={"model": "org/none", "ttft_s": 1}),
        "/v1/quotes",
    ),
    ("batch_not_found", 404): lambda w: (w.get("/v1/batches/batch_none"), "/v1/batches/{batch_id}"),
    ("method_not_allowed", 405): lambda w: (w.get(TEXT), TEXT),
    ("batch_not_cancellable", 409): _not_cancellable,
    ("request_too_large", 413): _too_large,
    ("batch_too_large", 413): _batch_too_large,
    ("invalid_value", 422): lambda w: (w.post(CHAT, json=_chat(w.market(), max_tokens=0)), CHAT),
    ("insufficient_quota", 429): _quota,
    ("queue_full", 429): _queue_full,
    ("internal_error", 500): _internal,
    ("engine_bid_lost", 502): _bid_lost,
    ("engine_unavailable", 503): lambda w: (
        w.post(CHAT, json=_chat(w.market(engine_url=f"http://127.0.0.1:{dead_port()}"))),
        CHAT,
    ),
    ("chat_template_unavailable", 503): _template,
    ("database_busy", 503): _admit_raising(lock_timeout()),
    ("database_unavailable", 503): _admit_raising(InterfaceError("connection already closed")),
    ("engine_timeout", 504): _timeout,
}


@pytest.mark.parametrize("entry", ERROR_CODES, ids=lambda x: f"{x.status}-{x.code}")
def test_each_documented_error_code_is_answered_as_documented(
    entry: ErrorCode, gateway, acme, sim, start_sim, settings, monkeypatch
):
    world = World(gateway, acme, sim, start_sim, settings, monkeypatch)
    answer, path = PRODUCERS[(entry.code, entry.status)](world)
    assert answer.status_code == entry.status, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["type"]) == (entry.code, entry.type)
    if path is None:  # no such endpoint: the error shape itself
        assert not problems(answer.json(), component("Error"))
        return
    operations = openapi_document()["paths"][path]
    # A 405 answers a method the path does not have: its operation's list is the one checked.
    method = answer.request.method.lower()
    method = method if method in operations else next(iter(operations))
    checked(answer, path, method)
    if entry.code in ("queue_full", "database_busy", "database_unavailable"):
        assert answer.headers["Retry-After"]
        documented = operations[method]["responses"][str(entry.status)]["headers"]
        assert "Retry-After" in documented
    if entry.code == "insufficient_quota":
        assert answer.headers["x-should-retry"] == "false"


def test_an_openai_client_error_is_the_documented_shape(gateway, acme, market):
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        acme.client(gateway).chat.completions.create(
            model=market.served_model, messages=HELLO, extra_body={"bid": -1}
        )
    assert not problems({"error": caught.value.body}, schema_of(CHAT, "post", 422))
