"""Fuzzing with text that cannot be kept and shapes no client should send: NUL, lone surrogates,
oversized strings and deeply nested JSON, in every field, as object keys, in query strings and
in paths, over the gateway (completions, models), the batch API and the logged-in JSON API.
Never a 5xx, never HTML: every ``/v1/`` answer is ``application/json``, and so is every answer
of the JSON API.

Lone surrogates cannot be encoded in UTF-8: bodies carry them as JSON escapes (``"\\ud800"``,
what ``json.dumps`` writes for them), URLs as the bytes UTF-8 would give them (``%ED%A0%80``,
not UTF-8). Derandomized, with a fixed number of examples, so a run is reproducible.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts.models import Role
from openai_api.batches import tasks as openai_tasks
from tests.accounts.factories import user_create
from tests.openai_api.conftest import market_create

FUZZ_SETTINGS = settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
UNKEPT = ["\x00", "\ud800", "\udbff", "\udc00", "\udfff"]
BAD_TEXT = st.builds(
    lambda head, bad, tail: head + bad + tail,
    st.text(max_size=6),
    st.sampled_from(UNKEPT),
    st.text(max_size=6),
)
OVERSIZED = st.sampled_from([257, 4_000, 70_000]).map(lambda n: "x" * n)
DEPTH = st.sampled_from([33, 64, 500, 5_000])


def deep_json(depth: int, kind: str) -> str:
    """Raw JSON text of ``depth`` nested arrays or objects (built as text: json.dumps would hit
    the recursion limit first)."""
    if kind == "array":
        return "[" * depth + '"leaf"' + "]" * depth
    return '{"k": ' * depth + "1" + "}" * depth


class Raw:
    """A JSON value given as raw text (spliced in after json.dumps)."""

    def __init__(self, text: str) -> None:
        self.text = text


BAD_VALUE = st.one_of(
    BAD_TEXT,
    OVERSIZED,
    st.builds(lambda d, k: Raw(deep_json(d, k)), DEPTH, st.sampled_from(["array", "object"])),
    st.lists(BAD_TEXT, min_size=1, max_size=2),
    st.dictionaries(BAD_TEXT, st.text(max_size=3), min_size=1, max_size=2),  # a bad key
)


def dumped(value: Any) -> str:
    """``json.dumps`` (ASCII: NUL and lone surrogates become escapes) with Raw values spliced."""
    raws: list[str] = []

    def mark(item: Any) -> Any:
        if isinstance(item, Raw):
            raws.append(item.text)
            return f"__raw_{len(raws) - 1}__"
        if isinstance(item, dict):
            return {k: mark(v) for k, v in item.items()}
        if isinstance(item, list):
            return [mark(v) for v in item]
        return item

    text = json.dumps(mark(value))
    for i, raw in enumerate(raws):
        text = text.replace(f'"__raw_{i}__"', raw)
    return text


def placed(body: dict[str, Any], path: tuple, value: Any) -> dict[str, Any]:
    """A deep copy of ``body`` with ``value`` at ``path`` (keys and list indexes); a path that
    ends in ``("<key>",)`` where the value is itself a key puts ``value`` in as a key."""
    body = json.loads(json.dumps(body))
    target: Any = body
    for step in path[:-1]:
        target = target[step]
    last = path[-1]
    if last == "<key>":
        if isinstance(value, str):
            target[value] = 1
        else:
            target["odd"] = value
    else:
        target[last] = value
    return body


def url_part(text: str) -> str:
    """``text`` percent-encoded as UTF-8 would give its bytes (surrogates included)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def assert_json_answer(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    content_type = response.headers.get("content-type", "")
    assert content_type.startswith("application/json"), (response.status_code, content_type)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert {"message", "type", "param", "code"} <= set(error)


CHAT_BODY = {"model": "M", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
COMPLETION_BODY = {"model": "M", "prompt": "Hi", "max_tokens": 1}
BODY_PATHS = [("model",), ("bid",), ("user",), ("stop",), ("request_class",), ("prompt",),
              ("stream_options",), ("extra",), ("<key>",), ("messages", 0, "content"),
              ("messages", 0, "role"), ("messages", 0, "<key>")]  # fmt: skip


@pytest.fixture
def no_batch_runs(monkeypatch) -> None:
    """Batches the fuzzer gets accepted are kept, never run."""
    monkeypatch.setattr(openai_tasks, "batch_enqueue", lambda *, batch_id: None)


def test_fuzz_completions_and_models_with_unkept_text(gateway, acme, start_sim, transactional_db):
    sim = start_sim(speed=1000.0)
    market = market_create(engine_url=sim.url)
    http = acme.http(gateway)

    @FUZZ_SETTINGS
    @given(
        endpoint=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
        path=st.sampled_from(BODY_PATHS),
        value=BAD_VALUE,
        query=st.none() | BAD_TEXT | OVERSIZED.map(lambda s: s[:2000]),
    )
    def fuzz(endpoint: str, path: tuple, value: Any, query: str | None) -> None:
        base = CHAT_BODY if endpoint == "/v1/chat/completions" else COMPLETION_BODY
        base = base | {"model": market.served_model}
        if path[0] == "messages" and "messages" not in base:
            path = ("prompt",)
        url = endpoint if query is None else f"{endpoint}?q={url_part(query)}"
        response = http.post(
            url,
            content=dumped(placed(base, path, value)).encode(),
            headers={"Content-Type": "application/json"},
        )
        assert_json_answer(response)
        if query is not None:
            assert_json_answer(http.get(f"/v1/models?{url_part(query)}={url_part(query)}"))
            assert_json_answer(http.get(f"/v1/{url_part(query)}"))

    try:
        fuzz()
    finally:
        http.close()


def batch_line(custom_id: str = "q0") -> dict[str, Any]:
    body = {"model": "org/m", "prompt": [1, 2, 3], "max_tokens": 1, "bid": 0.01}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}


LINE_PATHS = [("custom_id",), ("method",), ("url",), ("body",), ("<key>",), ("body", "model"),
              ("body", "prompt"), ("body", "user"), ("body", "bid"), ("body", "<key>")]  # fmt: skip


@pytest.mark.usefixtures("no_batch_runs")
def test_fuzz_the_batch_api_with_unkept_text(gateway, acme, transactional_db):
    http = acme.http(gateway)

    @FUZZ_SETTINGS
    @given(
        path=st.sampled_from(LINE_PATHS),
        value=BAD_VALUE,
        form=st.sampled_from(["jsonl", "json", "json-metadata", "json-input"]),
        segment=BAD_TEXT | OVERSIZED.map(lambda s: s[:3000]),
    )
    def fuzz(path: tuple, value: Any, form: str, segment: str) -> None:
        lines = [batch_line("first"), placed(batch_line("second"), path, value)]
        text = "".join(dumped(line) + "\n" for line in lines)
        if form == "jsonl":
            response = http.post(
                "/v1/batches", content=text.encode(), headers={"Content-Type": "application/jsonl"}
            )
        else:
            submitted: dict[str, Any] = {"input": text}
            if form == "json-metadata":
                submitted = {"input": dumped(batch_line()) + "\n", "metadata": {"team": value}}
            elif form == "json-input":
                submitted = {"input": value}
            response = http.post(
                "/v1/batches",
                content=dumped(submitted).encode(),
                headers={"Content-Type": "application/json"},
            )
        assert_json_answer(response)
        part = url_part(segment)
        assert_json_answer(http.get(f"/v1/batches?after={part}&limit={part}"))
        assert_json_answer(http.get(f"/v1/batches?after={part}"))
        assert_json_answer(http.get(f"/v1/batches/{part}"))
        assert_json_answer(http.post(f"/v1/batches/{part}/cancel"))
        for kind in ("output", "errors"):
            assert_json_answer(http.get(f"/v1/batches/{part}/{kind}"))

    try:
        fuzz()
    finally:
        http.close()


def test_fuzz_the_logged_in_json_api_with_unkept_text(acme, transactional_db):
    admin = user_create("fuzz-admin", tenant=acme.tenant, role=Role.ADMIN)
    client = Client(raise_request_exception=False)
    client.force_login(admin)
    base = f"/api/tenants/{acme.tenant.slug}"

    def answered_json(response) -> None:
        assert response.status_code < 500, response.content[:500]
        assert response["Content-Type"] == "application/json", response.status_code

    @FUZZ_SETTINGS
    @given(
        field=st.sampled_from(["name", "budget_limit", "budget_period", "extra", "<key>"]),
        value=BAD_VALUE,
        query=BAD_TEXT | OVERSIZED.map(lambda s: s[:3000]),
    )
    def fuzz(field: str, value: Any, query: str) -> None:
        body = placed({"name": "fuzzed key"}, (field,), value)
        answered_json(
            client.post(f"{base}/keys/", dumped(body).encode(), content_type="application/json")
        )
        part = url_part(query)
        answered_json(client.get(f"{base}/usage/?hours={part}"))
        for endpoint in ("budget", "keys", "invoices"):
            answered_json(client.get(f"{base}/{endpoint}/?{part}={part}"))

    fuzz()
