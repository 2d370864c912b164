"""Fuzzing the running gateway with malformed bodies and headers: never a 5xx, always an
OpenAI-style JSON error body for a refusal."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.openai_api.conftest import market_create

EXAMPLES = 150
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
HEADER_TEXT = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40).map(
    str.strip
)  # h11 refuses surrounding whitespace
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stream",
          "stream_options", "bid", "request_class", "temperature", "top_p", "stop", "n", "tools",
          "seed", "user"]  # fmt: skip
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "wizard"]) | JSON},
    optional={"content": st.text(max_size=30) | JSON},
)


def valid_body(model: str) -> dict[str, Any]:
    """A body both endpoints accept."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Hi"}],
        "prompt": "Hi",
        "max_tokens": 2,
    }


VALUES = {
    "model": JSON,
    "messages": st.lists(MESSAGE, max_size=3) | JSON,
    "prompt": st.text(max_size=30) | st.lists(st.integers(-5, 40), max_size=5) | JSON,
    "max_tokens": st.integers(-3, 8) | JSON,
    "stream": st.booleans() | JSON,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": JSON}) | JSON,
    "bid": st.decimals(allow_nan=True, places=12).map(str) | st.floats() | JSON,
    "temperature": st.floats() | JSON,
    "stop": JSON,
    "n": JSON,
    "request_class": HEADER_TEXT | JSON,
}


def mutated(body: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    """``body`` with up to three fields dropped, replaced by odd values, or added."""
    body = dict(body)
    for _ in range(data.draw(st.integers(0, 3))):
        name = data.draw(st.sampled_from(FIELDS) | st.text(max_size=8))
        if data.draw(st.booleans()) and name in body:
            del body[name]
        else:
            body[name] = data.draw(VALUES.get(name, JSON))
    return body


def encoded(body: Any) -> bytes:
    return json.dumps(body, allow_nan=True).encode()


def headers(key: str) -> st.SearchStrategy[dict[str, str]]:
    """Mostly the right key; any X-Bid, X-Request-Class and Content-Type."""
    authorization = st.just(f"Bearer {key}") | st.just(f"Bearer {key}") | HEADER_TEXT
    return st.fixed_dictionaries(
        {"Authorization": authorization},
        optional={
            "X-Bid": HEADER_TEXT | st.decimals(allow_nan=True, places=10).map(str).map(str.strip),
            "X-Request-Class": HEADER_TEXT,
            "Content-Type": st.sampled_from(["application/json", "text/plain"]) | HEADER_TEXT,
        },
    )


def assert_no_5xx(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}


def test_fuzz_bodies_and_headers_never_5xx(gateway, acme, start_sim, transactional_db):
    sim = start_sim(speed=1000.0)
    market = market_create(engine_url=sim.url)
    http = httpx.Client(base_url=gateway.url, timeout=30)

    @FUZZ_SETTINGS
    @given(
        endpoint=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
        kind=st.sampled_from(["mutated", "mutated", "json", "bytes"]),
        extra=headers(acme.key),
        data=st.data(),
    )
    def fuzz(endpoint: str, kind: str, extra: dict[str, str], data: st.DataObject) -> None:
        if kind == "mutated":
            body = encoded(mutated(valid_body(market.served_model), data))
        elif kind == "json":
            body = encoded(data.draw(JSON))
        else:
            body = data.draw(st.binary(max_size=64))
        response = http.post(endpoint, content=body, headers=extra)
        assert_no_5xx(response)
        if response.status_code == 200 and "text/event-stream" not in response.headers.get(
            "content-type", ""
        ):
            assert "auction" in response.json()

    try:
        fuzz()
    finally:
        http.close()


def test_fuzz_models_and_methods_never_5xx(gateway, acme, transactional_db):
    http = httpx.Client(base_url=gateway.url, timeout=30)

    @FUZZ_SETTINGS
    @given(
        method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
        path=st.sampled_from(["/v1/models", "/v1/chat/completions", "/v1/completions"]),
        extra=headers(acme.key),
        body=st.binary(max_size=32),
    )
    def fuzz(method: str, path: str, extra: dict[str, str], body: bytes) -> None:
        assert_no_5xx(http.request(method, path, headers=extra, content=body))

    try:
        fuzz()
    finally:
        http.close()
