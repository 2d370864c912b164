"""Bad input to the simulated engine: a JSON error naming the problem, never a 5xx."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions

BID = "sampling_params.custom_params.bid"
TENANT = "sampling_params.custom_params.tenant"
MAX_NEW = "sampling_params.max_new_tokens"


@pytest.fixture(scope="module")
def small_server() -> Iterator[ServerThread]:
    """A server whose KV cache holds 3,000 tokens, so no accepted request runs for long."""
    options = ServerOptions.of(
        port=0, speed=1000.0, settings=("kv_capacity_tokens=3000",), admin_token="s3cret"
    )
    with ServerThread(options) as sim:
        yield sim


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    """One connection pool for the module (a new client per request costs ~30 ms)."""
    with httpx.Client(timeout=30) as c:
        yield c


def ok_body(**changes) -> dict:
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1, "custom_params": {"bid": 0}}}
    body.update(changes)
    return body


def with_sampling(**params) -> dict:
    body = ok_body()
    body["sampling_params"].update(params)
    return body


def with_bid(bid) -> dict:
    return with_sampling(custom_params={"bid": bid})


CASES = [
    # (raw body, expected param; None when the body as a whole is wrong)
    (b"{", None),
    (b"\xff\xfe", None),
    (b"[1, 2]", None),
    (b"null", None),
    (json.dumps({"sampling_params": {}}), "text"),
    (json.dumps(ok_body(input_ids=[1, 2])), "text"),
    (json.dumps(ok_body(text=5)), "text"),
    (json.dumps(ok_body(text=["a", "b"])), "text"),
    (json.dumps(ok_body(text="")), "text"),
    (json.dumps({"input_ids": []}), "input_ids"),
    (json.dumps({"input_ids": ["a"]}), "input_ids"),
    (json.dumps({"input_ids": [-1]}), "input_ids"),
    (json.dumps({"input_ids": [True]}), "input_ids"),
    (json.dumps({"input_ids": [[1, 2]]}), "input_ids"),
    (json.dumps(ok_body(sampling_params=3)), "sampling_params"),
    (json.dumps(with_sampling(max_new_tokens=0)), MAX_NEW),
    (json.dumps(with_sampling(max_new_tokens=-1)), MAX_NEW),
    (json.dumps(with_sampling(max_new_tokens="5")), MAX_NEW),
    (json.dumps(with_sampling(max_new_tokens=1.5)), MAX_NEW),
    (json.dumps(with_sampling(max_new_tokens=True)), MAX_NEW),
    (json.dumps(with_sampling(max_new_tokens=5000)), MAX_NEW),  # can never fit the KV cache
    (json.dumps(with_sampling(temperature="hot")), "sampling_params.temperature"),
    (json.dumps(with_sampling(n=2)), "sampling_params.n"),
    (json.dumps(with_sampling(stop=[1])), "sampling_params.stop"),
    (json.dumps(with_sampling(custom_params=[])), "sampling_params.custom_params"),
    (json.dumps(with_bid(-1)), BID),
    (json.dumps(with_bid(-0.000001)), BID),
    (json.dumps(with_bid("1")), BID),
    (json.dumps(with_bid(True)), BID),
    (json.dumps(with_bid(1e7)), BID),  # above the maximum bid
    (json.dumps(with_bid(float("nan"))), BID),  # Python writes the NaN literal
    (json.dumps(with_bid(float("inf"))), BID),
    (json.dumps(with_bid(float("-inf"))), BID),
    (json.dumps(with_bid({"amount": 1})), BID),
    ('{"text": "hi", "sampling_params": {"custom_params": {"bid": 1e999}}}', BID),
    (json.dumps(ok_body(stream="yes")), "stream"),
    (json.dumps(ok_body(rid=5)), "rid"),
    (json.dumps(ok_body(rid="")), "rid"),
    (json.dumps(ok_body(rid=["a", "b"])), "rid"),
    (json.dumps(ok_body(rid="x" * 300)), "rid"),
    # The tenant's tag beside the bid: plain and short, or refused.
    (json.dumps(with_sampling(custom_params={"bid": 0, "tenant": ""})), TENANT),
    (json.dumps(with_sampling(custom_params={"bid": 0, "tenant": "a.b"})), TENANT),
    (json.dumps(with_sampling(custom_params={"bid": 0, "tenant": 17})), TENANT),
    (json.dumps(with_sampling(custom_params={"bid": 0, "tenant": "t" * 65})), TENANT),
]


@pytest.mark.parametrize(("raw", "param"), CASES)
def test_bad_generate_bodies_get_400_naming_the_field(small_server, client, raw, param) -> None:
    r = client.post(f"{small_server.url}/generate", content=raw)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == 400
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    if param is not None:
        assert param.rsplit(".", 1)[-1] in error["message"]


def test_wrong_method_and_unknown_path_are_json_errors(small_server) -> None:
    wrong = httpx.get(f"{small_server.url}/generate")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == 405
    missing = httpx.get(f"{small_server.url}/v2/generate")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404


def test_the_rid_is_the_requests_id_and_the_bid_a_field(small_server) -> None:
    custom = {"bid": 0.375, "tenant": "acme_2", "note": "not the market's"}
    body = {"text": "hi", "rid": "req-7~bid=9", "sampling_params": {"max_new_tokens": 1}}
    body["sampling_params"]["custom_params"] = custom
    r = httpx.post(f"{small_server.url}/generate", json=body, timeout=10)
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    # The rid is taken as it is, whatever it holds; the bid is the field's.
    assert (meta["id"], meta["bid"]) == ("req-7~bid=9", 0.375)
    # No custom_params, or none with a bid: a bid of 0.
    for sampling in ({"max_new_tokens": 1}, {"max_new_tokens": 1, "custom_params": {}}):
        r = httpx.post(f"{small_server.url}/generate", json={**body, "rid": None,
                       "sampling_params": sampling}, timeout=10)  # fmt: skip
        assert r.status_code == 200 and r.json()["meta_info"]["bid"] == 0.0


def test_a_valid_body_still_works_after_the_bad_ones(small_server) -> None:
    r = httpx.post(f"{small_server.url}/generate", json=ok_body(), timeout=10)
    assert r.status_code == 200
    assert r.json()["meta_info"]["completion_tokens"] == 1


# --- fuzzing ---------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
small_ints = st.integers(-3, 8)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "text": json_values | st.text(max_size=40),
        "input_ids": json_values | st.lists(st.integers(-2, 40_000), max_size=6),
        "sampling_params": json_values
        | st.fixed_dictionaries(
            {},
            optional={
                "max_new_tokens": json_values | small_ints,
                "temperature": json_values,
                "custom_params": json_values
                | st.fixed_dictionaries({}, optional={"bid": json_values}),
            },
        ),
        "stream": json_values,
        "rid": json_values,
    },
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=json_values | bodies | st.binary(max_size=40))
def test_fuzzed_generate_bodies_never_get_a_5xx(small_server, client, payload) -> None:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    r = client.post(f"{small_server.url}/generate", content=raw)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        error = r.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.endswith("data: [DONE]\n\n")
    else:
        body = r.json()
        assert len(body["output_ids"]) == body["meta_info"]["completion_tokens"]


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    payload=json_values
    | st.fixed_dictionaries(
        {}, optional={"policy": json_values, "reserve": json_values, "wait_bound_s": json_values}
    )
    | st.binary(max_size=20)
)
def test_fuzzed_admin_bodies_never_get_a_5xx(small_server, client, payload) -> None:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    r = client.post(
        f"{small_server.url}/admin/market", content=raw, headers={"Authorization": "Bearer s3cret"}
    )
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert r.json()["error"]["message"]
    else:
        info = client.get(f"{small_server.url}/get_model_info").json()
        assert (info["policy"], info["reserve"], info["wait_bound_s"]) == (
            r.json()["policy"], r.json()["reserve"], r.json()["wait_bound_s"],
        )  # fmt: skip
