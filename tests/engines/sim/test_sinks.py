"""Round records leave the server: a real Redis stream, a dead Redis, a JSONL file."""

from __future__ import annotations

import json
import socket
import time
import uuid

import httpx
import redis
from django.conf import settings

from engines.contract.records import round_record_checked, round_record_loads
from tests.conftest import dead_port
from tests.engines.sim.conftest import metric_values


def generate(url: str, rid: str, text: str, max_new_tokens: int = 3) -> httpx.Response:
    body = {"text": text, "rid": rid, "sampling_params": {"max_new_tokens": max_new_tokens}}
    return httpx.post(f"{url}/generate", json=body, timeout=30)


def test_round_records_reach_a_real_redis_stream(start_server) -> None:
    stream = f"test:sim-rounds:{uuid.uuid4().hex}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        sim = start_server(redis_url=settings.REDIS_URL, rounds_stream=stream, market="m1")
        r = generate(sim.url, "to-redis", "Settle me, please.")
        assert r.status_code == 200
        deadline = time.monotonic() + 5
        while not client.xlen(stream) and time.monotonic() < deadline:
            time.sleep(0.02)
        entries = client.xrange(stream)
        assert len(entries) == 1
        record = round_record_loads(entries[0][1][b"record"])
        assert record["market"] == "m1"
        assert record["engine"] == f"sim@127.0.0.1:{sim.port}"
        assert record["policy"] == "dfs-auction-kv-split"
        [admitted] = record["admitted"]
        meta = r.json()["meta_info"]
        assert admitted["request_id"] == "to-redis"
        assert admitted["prompt_tokens"] == meta["prompt_tokens"] == 7
        assert admitted["charge"] == meta["charge"] == 0
        assert record["round_id"] == meta["round_id"]
        values = metric_values(httpx.get(f"{sim.url}/metrics").text)
        assert values["sglang:round_records_dropped_total"] == 0
    finally:
        client.delete(stream)
        client.close()


def test_a_dead_redis_drops_records_without_stalling_generation(start_server) -> None:
    sim = start_server(redis_url=f"redis://127.0.0.1:{dead_port()}/0")
    started = time.monotonic()
    for i in range(5):
        assert generate(sim.url, f"r{i}", f"request number {i}").status_code == 200
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        values = metric_values(httpx.get(f"{sim.url}/metrics").text)
        if values["sglang:round_records_dropped_total"] == 5:
            break
        time.sleep(0.02)
    assert values["sglang:round_records_total"] == 5
    assert values["sglang:round_records_dropped_total"] == 5
    assert httpx.get(f"{sim.url}/health").status_code == 200


def test_records_go_to_callbacks_and_a_jsonl_file(start_server, tmp_path) -> None:
    path = tmp_path / "rounds.jsonl"
    sim = start_server(rounds_jsonl=str(path))
    seen: list[dict] = []
    sim.call(lambda: sim.server.callbacks.callbacks.append(seen.append))
    generate(sim.url, "one", "first request")
    generate(sim.url, "two", "second request")
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == seen
    assert [r["admitted"][0]["request_id"] for r in seen] == ["one", "two"]
    for record in seen:
        round_record_checked(record)


def test_health_probes_are_left_out_of_round_records(start_server) -> None:
    sim = start_server()
    seen: list[dict] = []
    sim.call(lambda: sim.server.callbacks.callbacks.append(seen.append))
    assert httpx.get(f"{sim.url}/health_generate", timeout=30).status_code == 200
    generate(sim.url, "real", "a real request")
    assert [a["request_id"] for r in seen for a in r["admitted"]] == ["real"]


def test_a_redis_that_never_answers_does_not_stall_generation(start_server) -> None:
    # A socket that completes the TCP handshake (the kernel's backlog) and then stays silent.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        sim = start_server(redis_url=f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
        started = time.monotonic()
        for i in range(3):
            assert generate(sim.url, f"s{i}", f"silent number {i}").status_code == 200
        assert time.monotonic() - started < 2  # the sink's 0.5 s timeout is not on this path
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            values = metric_values(httpx.get(f"{sim.url}/metrics").text)
            if values["sglang:round_records_dropped_total"] == 3:
                break
            time.sleep(0.05)
        assert values["sglang:round_records_dropped_total"] == 3
