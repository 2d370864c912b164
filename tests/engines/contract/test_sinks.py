"""The one family of round-record sinks both engines use: never blocking, counted the same."""

from __future__ import annotations

import json
import time
import uuid

import redis
from django.conf import settings

from engines.contract.sinks import (
    CallbackSink,
    FanoutSink,
    JsonlSink,
    MemorySink,
    RedisStreamSink,
)
from tests.conftest import dead_port

RECORD = {"schema": "x", "round_id": "r1"}  # sinks carry records, they do not check them


def test_a_full_queue_drops_at_once() -> None:
    sink = RedisStreamSink(f"redis://127.0.0.1:{dead_port()}/0", queue_size=2)
    sink.start()
    sink.close()  # the drainer has stopped: nothing leaves the queue now
    started = time.monotonic()
    for _ in range(5):
        sink.offer(RECORD)  # type: ignore[arg-type]
    assert time.monotonic() - started < 0.1
    assert (sink.pending, sink.dropped_queue_full, sink.dropped) == (2, 3, 3)


def test_the_redis_sink_reconnects_after_a_failure() -> None:
    stream = f"test:sink-rounds:{uuid.uuid4().hex}"
    sink = RedisStreamSink(settings.REDIS_URL, stream, backoff_s=0.05)
    try:
        sink.start()
        sink._down_until = time.monotonic() + 0.05  # noqa: SLF001 - as if it had just failed
        sink.offer(RECORD)  # type: ignore[arg-type]  # dropped: inside the back-off
        assert sink.flush()
        time.sleep(0.1)
        sink.offer(RECORD)  # type: ignore[arg-type]  # sent: after the back-off
        assert sink.flush()
        sink.close()
        assert (sink.dropped_destination_down, sink.sent) == (1, 1)
        assert redis.Redis.from_url(settings.REDIS_URL).xlen(stream) == 1
    finally:
        redis.Redis.from_url(settings.REDIS_URL).delete(stream)


def test_a_fanout_counts_what_its_sinks_count(tmp_path) -> None:
    """By hand: 3 records to memory (3 sent), to a file in a missing folder (3 failed), and to
    callbacks whose one function raises on the second record (2 sent, 1 failed)."""
    memory = MemorySink()
    unwritable = JsonlSink(tmp_path / "missing" / "rounds.jsonl")
    callbacks = CallbackSink()
    seen: list[dict] = []

    def keep(record: dict) -> None:
        if len(seen) == 1 and record["round_id"] == "r2":
            seen.append({"failed": True})
            raise RuntimeError("a consumer's bug")
        seen.append(record)

    callbacks.callbacks.append(keep)
    fanout = FanoutSink([memory, unwritable, callbacks])
    for i in (1, 2, 3):
        fanout.offer({**RECORD, "round_id": f"r{i}"})  # type: ignore[arg-type]
    assert fanout.flush()
    fanout.close()
    assert fanout.stats() == {
        "sent": 3 + 0 + 2,
        "dropped_queue_full": 0,
        "dropped_destination_down": 0 + 3 + 1,
        "pending": 0,
    }
    assert fanout.dropped == 4


def test_the_jsonl_sink_appends_one_record_a_line(tmp_path) -> None:
    path = tmp_path / "rounds.jsonl"
    path.write_text(json.dumps({"round_id": "r0"}) + "\n")  # what an earlier run wrote
    sink = JsonlSink(path)
    for i in (1, 2):
        sink.offer({**RECORD, "round_id": f"r{i}"})  # type: ignore[arg-type]
    assert sink.flush()
    sink.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["round_id"] for r in lines] == ["r0", "r1", "r2"]
    assert sink.stats() == {
        "sent": 2,
        "dropped_queue_full": 0,
        "dropped_destination_down": 0,
        "pending": 0,
    }
