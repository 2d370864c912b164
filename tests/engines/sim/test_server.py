"""The simulated engine's HTTP server against a real HTTP client, on a real TCP port."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import httpx
import pytest

from engines.contract.control import RedisControlStore, now_state
from engines.contract.records import round_record_checked
from engines.contract.tokenizer import encode
from engines.sim.config import EngineConfig
from tests.conftest import ENGINE_ADMIN_TOKEN
from tests.engines.sim.conftest import metric_values


def generate(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/generate", json=body, timeout=30)


def stream_chunks(response: httpx.Response) -> list[str]:
    """The ``data:`` payloads of an SSE response, in order."""
    return [
        line.removeprefix("data: ")
        for line in response.text.split("\n\n")
        if line.startswith("data: ")
    ]


def fresh(text: str) -> str:
    """``text`` behind a unique first word (2 tokens: the word and a space)."""
    return f"u{uuid.uuid4().hex} {text}"


def test_generate_returns_exactly_max_new_tokens(start_server) -> None:
    # A server of its own, a fixed prompt and rid: its tokenizer has seen only this prompt's
    # pieces, so the answer is the same every run (on a shared server an output id could be a
    # piece another test's prompt brought, and decode to that piece instead of a word).
    sim = start_server()
    r = generate(
        sim.url, text="Hello, world!", rid="exactly-seven", sampling_params={"max_new_tokens": 7}
    )
    assert r.status_code == 200
    body = r.json()
    meta = body["meta_info"]
    assert len(body["output_ids"]) == 7
    assert len(body["text"].split()) == 7  # unseen ids decode to one word each
    assert meta["completion_tokens"] == 7
    assert meta["finish_reason"] == {"type": "length", "length": 7}
    # "Hello" "," " " "world" "!"
    assert meta["prompt_tokens"] == 5
    assert meta["cached_tokens"] == 0
    assert meta["bid"] == 0 and meta["charge"] == 0
    assert 0 <= meta["queue_time"] <= meta["ttft"] <= meta["e2e_latency"]
    assert meta["round_id"] and meta["position"] == 0
    assert meta["id"] == "exactly-seven"
    unnamed = generate(sim.url, text="Hi", sampling_params={"max_new_tokens": 1}).json()
    assert len(unnamed["meta_info"]["id"]) == 32  # a uuid4 hex when no rid is given


def test_stream_sends_one_chunk_per_token_then_done(shared_server) -> None:
    r = generate(
        shared_server.url,
        text=fresh("Stream me."),
        stream=True,
        rid="stream-1",
        sampling_params={"max_new_tokens": 5},
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = stream_chunks(r)
    assert chunks[-1] == "[DONE]"
    data = [json.loads(c) for c in chunks[:-1]]
    assert len(data) == 5
    for i, chunk in enumerate(data, start=1):
        assert len(chunk["output_ids"]) == i
        assert chunk["meta_info"]["completion_tokens"] == i
        assert chunk["meta_info"]["id"] == "stream-1"
        if i > 1:
            assert chunk["text"].startswith(data[i - 2]["text"])  # cumulative
            assert chunk["output_ids"][: i - 1] == data[i - 2]["output_ids"]
    assert [c["meta_info"]["finish_reason"] for c in data[:-1]] == [None] * 4
    assert data[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert data[-1]["meta_info"]["e2e_latency"] >= data[-1]["meta_info"]["ttft"]
    assert len(data[-1]["text"].split()) == 5


def test_input_ids_are_the_prompt(shared_server) -> None:
    ids = [31_000 + i for i in range(13)]
    r = generate(shared_server.url, input_ids=ids, sampling_params={"max_new_tokens": 2})
    assert r.status_code == 200
    assert r.json()["meta_info"]["prompt_tokens"] == 13


def test_prompt_tokens_is_the_tokenizers_count(shared_server) -> None:
    text = fresh("A fox, a dog;  and\n\ta cat.")
    r = generate(shared_server.url, text=text, sampling_params={"max_new_tokens": 1})
    assert r.json()["meta_info"]["prompt_tokens"] == len(encode(text))
    # by hand: u<hex> _ A _ fox , _ a _ dog ; __ and \n\t a _ cat .
    assert len(encode(text)) == 18


def test_cached_tokens_of_repeated_and_shared_prompts(start_server) -> None:
    sim = start_server()
    base = "The quick brown fox jumps over the lazy dog."  # 18 tokens, counted by hand
    assert len(encode(base)) == 18
    params = {"max_new_tokens": 4}
    first = generate(sim.url, text=base, sampling_params=params).json()["meta_info"]
    again = generate(sim.url, text=base, sampling_params=params).json()["meta_info"]
    cat = generate(sim.url, text=base.replace("dog", "cat"), sampling_params=params).json()
    assert first["cached_tokens"] == 0
    assert again["cached_tokens"] == 17  # all but the last token, which is recomputed
    assert cat["meta_info"]["cached_tokens"] == 16  # "The quick ... lazy " is shared


# A decoding sequence costs 50 ms of engine time per step (2.5 ms of wall time at speed 20): a
# blocker of 200 tokens holds the engine for about half a second. Prefill costs are unchanged.
SLOW_DECODE = "decode_seq_s=0.05"


def _blocker(url: str, rid: str, tokens: int, first_token: threading.Event) -> threading.Thread:
    """Stream a long request in a thread; ``first_token`` is set once it runs."""

    def run() -> None:
        body = {
            "text": fresh("block"),
            "rid": rid,
            "stream": True,
            "sampling_params": {"max_new_tokens": tokens},
        }
        with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    first_token.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert first_token.wait(10)
    return thread


def test_higher_bid_is_served_first_and_pays_the_threshold(start_server) -> None:
    # One request runs at a time, so both bidders wait for the blocker and meet in one round.
    sim = start_server(policy="highest-bid", settings=["max_running_requests=1", SLOW_DECODE])
    records: list[dict] = []
    sim.call(lambda: sim.server.callbacks.callbacks.append(records.append))
    blocker = _blocker(sim.url, "blocker", 200, threading.Event())
    results: dict[str, dict] = {}

    def send(rid: str, ids: list[int], bid: float) -> None:
        body = {
            "input_ids": ids,
            "rid": rid,
            "sampling_params": {"max_new_tokens": 3, "custom_params": {"bid": bid}},
        }
        results[rid] = httpx.post(f"{sim.url}/generate", json=body, timeout=60).json()

    low_ids, high_ids = list(range(20_000, 20_020)), list(range(21_000, 21_010))
    threads = [
        threading.Thread(target=send, args=("low", low_ids, 1.0)),
        threading.Thread(target=send, args=("high", high_ids, 2.0)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    blocker.join(60)
    high, low = results["high"]["meta_info"], results["low"]["meta_info"]
    first = next(r for r in records if r["admitted"][0]["request_id"] in ("high", "low"))
    round_record_checked(first)
    assert first["admitted"][0]["request_id"] == "high"
    assert first["waiting"] == 2  # both bidders were in the round
    # Hand-worked (docs/mechanism.md, "Payments"): work = prompt tokens + 1 overhead token, none
    # cached. High saves the low request's work by outbidding 1.0 $/s, so it pays
    # 1.0 x 21 / tokens_per_s.
    cfg = EngineConfig()
    n = cfg.chunked_prefill_size
    step = cfg.step_fixed_s + n * cfg.prefill_token_s + n * (n / 2) * cfg.prefill_attention_s
    tps = n / step
    assert high["position"] == 0 and high["cached_tokens"] == 0
    assert high["planned_completion_s"] == pytest.approx(11 / tps)
    assert high["time_saved_s"] == pytest.approx(21 / tps)
    assert high["charge"] == pytest.approx(1.0 * 21 / tps)
    assert high["charge"] > 0 and low["charge"] == 0
    seq = {rid: int(results[rid]["meta_info"]["round_id"].rsplit(":", 1)[1]) for rid in results}
    assert seq["high"] < seq["low"]  # served first
    assert results["high"]["meta_info"]["e2e_latency"] > 0
    admitted = {a["request_id"]: a for r in records for a in r["admitted"]}
    assert admitted["high"]["charge"] == pytest.approx(high["charge"])
    revenue = metric_values(httpx.get(f"{sim.url}/metrics").text)
    assert revenue["sglang:priority_revenue_dollars_total"] == pytest.approx(high["charge"])


def test_health_model_info_and_server_info(start_server) -> None:
    sim = start_server(market="llama-8b", reserve=0.5, settings=["kv_capacity_tokens=1000"])
    health = httpx.get(f"{sim.url}/health")
    assert health.status_code == 200 and health.text == ""
    assert httpx.get(f"{sim.url}/health_generate", timeout=30).status_code == 200
    info = httpx.get(f"{sim.url}/get_model_info").json()
    assert info == {
        "model_path": "sim/llama-8b",
        "served_model_name": "sim/llama-8b",
        "tokenizer_path": "sim-words-32k",
        "is_generation": True,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "market": "llama-8b",
        "policy": "dfs-auction-kv-split",
        "reserve": 0.5,
        "wait_bound_s": 0.0,
    }
    server = httpx.get(f"{sim.url}/get_server_info").json()
    assert server["max_total_num_tokens"] == 1000
    assert server["engine_config"]["kv_capacity_tokens"] == 1000
    assert server["speed"] == 20.0 and server["port"] == sim.port
    assert server["engine_id"] == f"sim@127.0.0.1:{sim.port}"


def test_metrics_counters_move_by_the_right_amounts(start_server) -> None:
    sim = start_server()
    before = metric_values(httpx.get(f"{sim.url}/metrics").text)
    assert before["sglang:num_requests_total"] == 0
    text = "Count these tokens, please."  # Count _ these _ tokens , _ please . = 9
    first = generate(sim.url, text=text, sampling_params={"max_new_tokens": 6}).json()
    second = generate(sim.url, text=text, sampling_params={"max_new_tokens": 4}).json()
    r = httpx.get(f"{sim.url}/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    after = metric_values(r.text)
    assert after["sglang:prompt_tokens_total"] == 18
    assert after["sglang:cached_tokens_total"] == 8
    assert after["sglang:generation_tokens_total"] == 10
    assert after["sglang:num_requests_total"] == 2
    assert after["sglang:cache_hit_rate"] == pytest.approx(8 / 18)
    assert after["sglang:num_queue_reqs"] == 0 and after["sglang:num_running_reqs"] == 0
    assert after["sglang:auction_rounds_total"] == 2
    assert after["sglang:round_records_total"] == 2
    assert after["sglang:round_records_dropped_total"] == 0
    assert after["sglang:priority_revenue_dollars_total"] == 0
    ttfts = [first["meta_info"]["ttft"], second["meta_info"]["ttft"]]
    assert after["sglang:time_to_first_token_seconds_count"] == 2
    assert after["sglang:time_to_first_token_seconds_sum"] == pytest.approx(sum(ttfts))
    assert after["sglang:time_to_first_token_seconds_bucket[le=+Inf]"] == 2
    e2e = first["meta_info"]["e2e_latency"] + second["meta_info"]["e2e_latency"]
    assert after["sglang:e2e_request_latency_seconds_sum"] == pytest.approx(e2e)


def test_admin_market_changes_policy_and_reserve_from_the_next_round(start_server) -> None:
    sim = start_server(admin_token="s3cret")
    records: list[dict] = []
    sim.call(lambda: sim.server.callbacks.callbacks.append(records.append))
    url = f"{sim.url}/admin/market"
    assert httpx.post(url, json={"policy": "fcfs"}).status_code == 401
    wrong = httpx.post(url, json={"policy": "fcfs"}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == 401
    auth = {"Authorization": "Bearer s3cret"}
    for body, param in [
        ({"policy": "cheapest"}, "policy"),
        ({"reserve": -1}, "reserve"),
        ({"reserve": "0.1"}, "reserve"),
        ({"reserve_price": 1}, "reserve_price"),
        ({"wait_bound_s": 0.1}, "wait_bound_s"),
    ]:
        bad = httpx.post(url, json=body, headers=auth)
        assert bad.status_code == 400, body
        assert bad.json()["error"]["param"] == param
    ok = httpx.post(url, json={"policy": "fcfs", "reserve": 0.25}, headers=auth)
    assert ok.status_code == 200
    assert ok.json() == {"policy": "fcfs", "reserve": 0.25, "wait_bound_s": 0.0}
    info = httpx.get(f"{sim.url}/get_model_info").json()
    assert (info["policy"], info["reserve"]) == ("fcfs", 0.25)
    bound = httpx.post(url, json={"wait_bound_s": 20}, headers=auth)
    assert bound.json() == {"policy": "fcfs", "reserve": 0.25, "wait_bound_s": 20.0}
    assert httpx.get(f"{sim.url}/get_model_info").json()["wait_bound_s"] == 20.0
    generate(
        sim.url,
        text="after the change",
        rid="after",
        sampling_params={"max_new_tokens": 1, "custom_params": {"bid": 0.1}},
    )
    record = next(r for r in records if r["admitted"][0]["request_id"] == "after")
    assert (record["policy"], record["reserve"]) == ("fcfs", 0.25)
    assert record["admitted"][0]["effective_bid"] == 0  # under the reserve


def test_admin_market_is_closed_without_an_admin_token(start_server) -> None:
    """Whoever reaches an engine must not set the market's prices: without a token configured
    the control path refuses everyone, whatever they send."""
    sim = start_server(admin_token=None, reserve=0.001)
    url = f"{sim.url}/admin/market"
    for headers in ({}, {"Authorization": "Basic e30="}, {"Authorization": "Bearer anything"}):
        refused = httpx.post(url, json={"policy": "fcfs", "reserve": 1e6}, headers=headers)
        assert refused.status_code == 403, refused.text
        assert "--admin-token or ENGINE_ADMIN_TOKEN" in refused.json()["error"]["message"]
    info = httpx.get(f"{sim.url}/get_model_info").json()
    assert (info["policy"], info["reserve"]) == ("dfs-auction-kv-split", 0.001)


def test_a_local_override_is_undone_at_the_next_control_poll(start_server, settings) -> None:
    """An engine that follows the market's control store runs the store's values: a push to its
    own control path that differs lasts until the follower's next poll (0.5 s)."""
    market = f"override-{uuid.uuid4().hex[:8]}"
    store = RedisControlStore(settings.REDIS_URL, market)
    store.write(now_state("dfs-auction-density", 0.001, wait_bound_s=30))
    sim = start_server(follow_control=True, redis_url=settings.REDIS_URL, market=market)
    records: list[dict] = []
    sim.call(lambda: sim.server.callbacks.callbacks.append(records.append))
    auth = {"Authorization": f"Bearer {ENGINE_ADMIN_TOKEN}"}
    pushed = httpx.post(
        f"{sim.url}/admin/market",
        json={"policy": "fcfs", "reserve": 1e6, "wait_bound_s": 0},
        headers=auth,
    )
    assert pushed.status_code == 200
    info = httpx.get(f"{sim.url}/get_model_info").json()
    assert (info["policy"], info["reserve"], info["wait_bound_s"]) == ("fcfs", 1e6, 0.0)
    deadline = time.monotonic() + 10
    while (info["policy"], info["reserve"], info["wait_bound_s"]) != (
        "dfs-auction-density",
        0.001,
        30.0,
    ):
        assert time.monotonic() < deadline, f"the override stayed: {info}"
        generate(sim.url, text="tick", sampling_params={"max_new_tokens": 1})
        info = httpx.get(f"{sim.url}/get_model_info").json()
    generate(sim.url, text="after", rid="after", sampling_params={"max_new_tokens": 1})
    record = next(r for r in records if r["admitted"][0]["request_id"] == "after")
    assert (record["policy"], record["reserve"]) == ("dfs-auction-density", 0.001)


def test_disconnect_while_waiting_cancels_the_request(start_server) -> None:
    sim = start_server(settings=["max_running_requests=1", SLOW_DECODE])
    blocker = _blocker(sim.url, "blocker", 200, threading.Event())
    with pytest.raises(httpx.ReadTimeout):
        generate_timeout = httpx.Timeout(30, read=0.2)
        httpx.post(
            f"{sim.url}/generate",
            timeout=generate_timeout,
            json={"text": "never mind", "rid": "gone"},
        )
    deadline = time.monotonic() + 5
    while sim.call(lambda: "gone" in sim.server.engine.waiting) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not sim.call(lambda: "gone" in sim.server.engine.waiting)
    values = metric_values(httpx.get(f"{sim.url}/metrics").text)
    assert values["sglang:requests_cancelled_total"] == 1
    blocker.join(60)


def test_disconnect_while_running_lets_it_finish(start_server) -> None:
    sim = start_server()
    body = {"text": "talk a while", "stream": True, "sampling_params": {"max_new_tokens": 300}}
    with httpx.stream("POST", f"{sim.url}/generate", json=body, timeout=30) as r:
        next(line for line in r.iter_lines() if line.startswith("data: "))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        values = metric_values(httpx.get(f"{sim.url}/metrics").text)
        if values["sglang:num_requests_total"] == 1:
            break
        time.sleep(0.05)
    assert values["sglang:num_requests_total"] == 1
    assert values["sglang:generation_tokens_total"] == 300
    assert sim.call(lambda: sim.server.loop.abandoned_outputs) == 1
    assert generate(sim.url, text="still serving").status_code == 200


def test_full_queue_answers_429_with_retry_after(start_server) -> None:
    sim = start_server(max_queue=1, settings=["max_running_requests=1", SLOW_DECODE])
    # The blocker decodes for 30 s (600 tokens at 0.05 s), long enough on a loaded machine for
    # the waiter to be seen queued behind it before the third request arrives.
    blocker = _blocker(sim.url, "blocker", 600, threading.Event())
    waiter = threading.Thread(
        target=generate,
        args=(sim.url,),
        kwargs={"text": "in the queue", "sampling_params": {"max_new_tokens": 2}},
    )
    waiter.start()
    deadline = time.monotonic() + 20
    while not sim.call(lambda: len(sim.server.engine.waiting)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sim.call(lambda: len(sim.server.engine.waiting)) == 1, "the waiter never queued"
    r = generate(sim.url, text="one too many")
    assert r.status_code == 429
    assert r.headers["Retry-After"] == "1"
    assert r.json()["error"]["type"] == "rate_limit_error"
    dup = generate(sim.url, text="again", rid="blocker")
    assert dup.status_code == 400 and dup.json()["error"]["param"] == "rid"
    waiter.join(90)
    blocker.join(60)


def test_concurrent_requests_sharing_a_system_prompt(start_server) -> None:
    sim = start_server()
    system = "You are the market's assistant. Answer in one short sentence. " * 4
    questions = [f"Question {i}: what is bid number {i}?" for i in range(40)]

    def body(i: int) -> dict:
        params = {"max_new_tokens": 5 + i % 3}
        return {"text": system + questions[i], "stream": i % 2 == 0, "sampling_params": params}

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            url = f"{sim.url}/generate"
            return await asyncio.gather(*(client.post(url, json=body(i)) for i in range(40)))

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 40
    cached = 0
    for i, r in enumerate(responses):
        if i % 2 == 0:
            chunks = stream_chunks(r)
            assert chunks[-1] == "[DONE]" and len(chunks) == 1 + 5 + i % 3
            meta = json.loads(chunks[-2])["meta_info"]
        else:
            meta = r.json()["meta_info"]
        assert meta["completion_tokens"] == 5 + i % 3
        assert meta["prompt_tokens"] == len(encode(system + questions[i]))
        cached += meta["cached_tokens"]
    # The system prompt is computed once, or a few times while the first prefill is in flight.
    assert cached >= 30 * len(encode(system))
