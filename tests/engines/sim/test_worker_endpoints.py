"""What SGLang's model gateway (smg) reads from a worker, as the simulated engine serves it:
``/server_info`` and ``/model_info`` (how it knows the worker is SGLang, and its model), and
``/v1/loads`` (the load its routing and overload protection act on), in SGLang 0.5.23's shapes.
The load figures are worked out by hand from the requests sent and the engine's KV rules."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions

KV_CAPACITY = 10_000
STEP_S = 0.05  # every step's fixed cost: the running request decodes at most 20 tokens a second


@pytest.fixture
def busy_engine():
    """An engine running one request at a time: ``long`` (100 prompt tokens, 100 to generate,
    5 s at least) runs; ``b`` (50 tokens) and ``c`` (30 tokens), sent after it, wait. All three
    prompts are distinct token ids: nothing is cached."""
    settings = (
        "max_running_requests=1",
        f"kv_capacity_tokens={KV_CAPACITY}",
        f"step_fixed_s={STEP_S}",
    )
    sim = ServerThread(ServerOptions.of(port=0, speed=1.0, settings=settings)).start()

    def send(rid: str, ids: list[int], max_new: int) -> None:
        body = {"rid": rid, "input_ids": ids, "sampling_params": {"max_new_tokens": max_new}}
        try:
            httpx.post(f"{sim.url}/generate", json=body, timeout=60)
        except httpx.HTTPError:
            pass  # the server stops under it at the end

    threads = [threading.Thread(target=send, args=("long", list(range(1, 101)), 100))]
    threads += [
        threading.Thread(target=send, args=("b", list(range(1001, 1051)), 5)),
        threading.Thread(target=send, args=("c", list(range(2001, 2031)), 5)),
    ]
    threads[0].start()
    deadline = time.monotonic() + 10
    while loads(sim.url)["num_running_reqs"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    for t in threads[1:]:
        t.start()
    while loads(sim.url)["num_waiting_reqs"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    try:
        yield sim
    finally:
        sim.stop()
        for t in threads:
            t.join(timeout=10)


def loads(url: str, include: str | None = None) -> dict:
    params = {} if include is None else {"include": include}
    body = httpx.get(f"{url}/v1/loads", params=params, timeout=10).json()
    (snapshot,) = body["loads"]  # one data-parallel rank
    return snapshot


def test_the_load_smg_routes_on(busy_engine) -> None:
    body = httpx.get(f"{busy_engine.url}/v1/loads", timeout=10).json()
    assert set(body) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
    # What smg asks for: core, disagg, queues, memory (the engine has no memory section).
    snapshot = loads(busy_engine.url, "core,disagg,queues,memory")
    assert snapshot["dp_rank"] == 0
    assert (snapshot["num_running_reqs"], snapshot["num_waiting_reqs"]) == (1, 2)
    # The running request holds its prompt (100, in the cache, locked) and the room for its
    # 100 output tokens (reserved at admission): 200 of 10,000.
    assert snapshot["num_used_tokens"] == 200
    assert snapshot["token_usage"] == 0.02
    assert snapshot["num_waiting_uncached_tokens"] == 50 + 30
    assert snapshot["num_total_tokens"] == snapshot["num_active_tokens"] == 200 + 80
    assert snapshot["max_total_num_tokens"] == KV_CAPACITY
    assert snapshot["max_running_requests"] == 1 and snapshot["utilization"] == 1.0
    assert snapshot["total_prefill_uncached_tokens"] == 100
    assert snapshot["queues"] == {
        "waiting": 2, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0
    }  # fmt: skip
    assert snapshot["disaggregation"]["mode"] == "null"
    assert "memory" not in snapshot
    # One sequence decoding at a step of at least 0.05 s: 20 tokens a second at most, and a
    # window of 0.5 s or more counts at most one token beyond that (a step that began before).
    time.sleep(0.5)
    assert 0 < loads(busy_engine.url, "core")["gen_throughput"] <= 1 / STEP_S + 1 / 0.5


def test_sections_as_asked_and_an_unknown_one_refused(busy_engine) -> None:
    core = loads(busy_engine.url, "core")
    assert "queues" not in core and "disaggregation" not in core
    assert "queues" in loads(busy_engine.url, "core,queues")
    assert {"queues", "disaggregation"} <= set(loads(busy_engine.url, "all"))
    bad = httpx.get(f"{busy_engine.url}/v1/loads", params={"include": "core,gpu"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "include"


def test_server_and_model_info_under_both_names(start_server) -> None:
    sim = start_server(market="llama-8b", settings=["max_running_requests=7"])
    server = httpx.get(f"{sim.url}/server_info").json()
    assert server == httpx.get(f"{sim.url}/get_server_info").json()
    # The fields smg reads to register an SGLang worker: one rank, no disaggregation.
    assert {k: server[k] for k in ("model_path", "served_model_name", "tp_size", "dp_size",
                                   "pp_size", "disaggregation_mode", "is_embedding",
                                   "max_running_requests")} == {
        "model_path": "sim/llama-8b", "served_model_name": "sim/llama-8b", "tp_size": 1,
        "dp_size": 1, "pp_size": 1, "disaggregation_mode": "null", "is_embedding": False,
        "max_running_requests": 7,
    }  # fmt: skip
    model = httpx.get(f"{sim.url}/model_info").json()
    assert model == httpx.get(f"{sim.url}/get_model_info").json()
    assert model["served_model_name"] == "sim/llama-8b" and model["is_generation"] is True
