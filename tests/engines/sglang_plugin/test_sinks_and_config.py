"""The round-record sink never blocks the scheduler; the plugin's config is read strictly."""

from __future__ import annotations

import json
import time

import pytest

from engines.contract.knobs import MarketKnobs
from engines.contract.records import SCHEMA, round_record_loads
from engines.contract.sinks import MemorySink, RedisStreamSink, sink_for
from engines.sglang_plugin.config import PluginConfig, config_from_env
from mechanism import DEFAULT_TOKENS_PER_SECOND
from tests.conftest import dead_port


def _record(seq: int) -> dict:
    return {
        "schema": SCHEMA,
        "engine": "sglang-test",
        "market": "m",
        "epoch": "0",
        "round_id": f"sglang-test:0:{seq}",
        "seq": seq,
        "time": 1.0,
        "policy": "dfs-auction",
        "reserve": 0.0,
        "tokens_per_second": 1e4,
        "waiting": 1,
        "subtrees": [],
        "admitted": [],
    }


def test_a_dead_redis_drops_and_counts_without_blocking() -> None:
    sink = RedisStreamSink(f"redis://127.0.0.1:{dead_port()}/0", "rounds", queue_size=50)
    start = time.monotonic()
    for seq in range(1, 201):
        sink.offer(_record(seq))
    offered_in = time.monotonic() - start
    assert offered_in < 0.5, f"offer blocked: {offered_in:.3f} s for 200 records"
    assert sink.flush(timeout_s=10.0)
    stats = sink.stats()
    assert stats["sent"] == 0
    assert stats["dropped_queue_full"] + stats["dropped_destination_down"] == 200
    assert stats["dropped_destination_down"] >= 1 and stats["pending"] == 0
    sink.close()


def test_a_full_queue_drops_and_counts() -> None:
    sink = RedisStreamSink(f"redis://127.0.0.1:{dead_port()}/0", "rounds", queue_size=1)
    sink.start()  # then stop the drain thread, so that the queue stays full
    sink.close()
    sink.offer(_record(1))
    sink.offer(_record(2))
    assert sink.dropped_queue_full >= 1


def test_records_reach_the_redis_stream() -> None:
    import redis
    from django.conf import settings

    stream = f"test-sglang-plugin:{time.time_ns()}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        sink = RedisStreamSink(settings.REDIS_URL, stream)
        for seq in (1, 2, 3):
            sink.offer(_record(seq))
        assert sink.flush(timeout_s=10.0)
        entries = client.xrange(stream)
        assert [round_record_loads(fields[b"record"])["seq"] for _, fields in entries] == [1, 2, 3]
        assert sink.stats()["sent"] == 3
        sink.close()
    finally:
        client.delete(stream)
        client.close()


def test_without_redis_records_stay_in_memory() -> None:
    sink = sink_for(None, "rounds", queue_size=10)
    assert isinstance(sink, MemorySink)
    sink.offer(_record(1))
    assert list(sink.records) == [_record(1)] and sink.stats()["sent"] == 1


def test_config_from_env_and_file(tmp_path) -> None:
    assert config_from_env({}) == PluginConfig()
    assert not PluginConfig().market_policy
    path = tmp_path / "market.json"
    path.write_text(
        json.dumps(
            {
                "policy": "dfs-auction",
                "reserve": 0.25,
                "tokens_per_second": 8000,
                "overhead_tokens": 2,
                "market": "llama-8b",
                "engine_id": "gpu-1",
                "redis_url": "redis://r:6379/1",
                "rounds_stream": "rounds-x",
            }
        )
    )
    config = config_from_env({"MARKET_PLUGIN_CONFIG": str(path), "REDIS_URL": "redis://other/0"})
    assert config == PluginConfig(
        policy="dfs-auction",
        knobs=MarketKnobs(
            reserve=0.25,
            tokens_per_second=8000,
            overhead_tokens=2,
            market="llama-8b",
            rounds_stream="rounds-x",
        ),
        engine_id="gpu-1",
        redis_url="redis://r:6379/1",
    )
    assert config.tokens_per_second == 8000
    assert PluginConfig().tokens_per_second == DEFAULT_TOKENS_PER_SECOND
    assert config.market_policy
    env = {"MARKET_PLUGIN_CONFIG": str(path), "MARKET_POLICY": "highest-bid"}
    assert config_from_env(env).policy == "highest-bid"
    assert config_from_env({"MARKET_POLICY": "lpm", "REDIS_URL": "redis://x/0"}) == PluginConfig(
        policy="lpm", redis_url="redis://x/0"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot read a JSON object"),
        ("[1]", "expected a JSON object"),
        ('{"policy": "dfs-auction", "bid": 1}', "unknown key(s) bid"),
        ('{"reserve": -1}', "reserve must be >= 0"),
        ('{"tokens_per_second": 0}', "tokens_per_second must be > 0"),
        ('{"overhead_tokens": 1.5}', "overhead_tokens must be an integer"),
        ('{"reserve": "NaN"}', "reserve must be a finite number"),
    ],
)
def test_a_bad_config_says_what_is_wrong(tmp_path, content: str, message: str) -> None:
    path = tmp_path / "market.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="MARKET_PLUGIN_CONFIG") as info:
        config_from_env({"MARKET_PLUGIN_CONFIG": str(path)})
    assert message in str(info.value)


def test_a_missing_config_file_says_so(tmp_path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        config_from_env({"MARKET_PLUGIN_CONFIG": str(tmp_path / "nope.json")})
