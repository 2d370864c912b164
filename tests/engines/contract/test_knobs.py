"""The market's knobs are defined once: both engines embed the contract's ``MarketKnobs``, and
a knob is checked, defaulted and overridden by the one rule whichever engine runs the market."""

from __future__ import annotations

import dataclasses

import pytest

from engines.contract.knobs import KNOB_NAMES, MarketKnobs, assigned, split_knobs
from engines.sglang_plugin.config import PluginConfig, config_from_env
from engines.sim import Engine, EngineConfig, settings_split
from engines.sim.server import ServerOptions
from mechanism import DEFAULT_TOKENS_PER_SECOND

THE_KNOBS = {
    "market",
    "reserve",
    "tokens_per_second",
    "overhead_tokens",
    "in_batch_defer_tokens",
    "evict_by_order",
    "book_interval_s",
    "rounds_stream",
    "charge_scope",
    "wait_bound_s",
    "wait_steps",
    "wait_density",
}


def test_both_engines_embed_the_one_set_of_knobs() -> None:
    assert KNOB_NAMES == THE_KNOBS
    for config in (PluginConfig, ServerOptions):
        kinds = {f.name: f.type for f in dataclasses.fields(config)}
        assert kinds["knobs"] == "MarketKnobs"
        assert not (set(kinds) & THE_KNOBS), f"{config.__name__} redefines a knob"
    assert not ({f.name for f in dataclasses.fields(EngineConfig)} & THE_KNOBS)
    assert PluginConfig().knobs == ServerOptions().knobs == Engine().knobs == MarketKnobs()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"reserve": -0.5}, "reserve must be >= 0"),
        ({"reserve": float("nan")}, "reserve must be a finite number"),
        ({"reserve": True}, "reserve must be a finite number"),
        ({"reserve": 2e6}, r"reserve must be <= 1e\+06"),
        ({"tokens_per_second": 0}, "tokens_per_second must be > 0"),
        ({"overhead_tokens": 1.5}, "overhead_tokens must be an integer"),
        ({"in_batch_defer_tokens": -1}, "in_batch_defer_tokens must be an integer >= 0"),
        ({"evict_by_order": 1}, "evict_by_order must be true or false"),
        ({"book_interval_s": -1}, "book_interval_s must be >= 0"),
        ({"market": ""}, "market must be a non-empty string"),
        ({"rounds_stream": 3}, "rounds_stream must be a non-empty string"),
        ({"charge_scope": "account"}, "charge scope must be one of request, tenant"),
        ({"wait_bound_s": 0.4}, r"wait bound must be 0 \(off\) or 0.5..3600 seconds"),
        ({"wait_bound_s": 3601}, r"wait bound must be 0 \(off\) or 0.5..3600 seconds"),
        ({"wait_bound_s": float("inf")}, r"wait bound must be 0 \(off\)"),
        ({"wait_bound_s": "8"}, r"wait bound must be 0 \(off\)"),
        ({"wait_steps": 0}, "wait_steps must be an integer >= 1"),
        ({"wait_density": 0}, "wait_density must be > 0"),
        ({"wait_density": 2e6}, r"wait_density must be <= 1e\+06"),
    ],
)
def test_a_bad_knob_is_refused_the_same_way_by_both_engines(values, message) -> None:
    with pytest.raises(ValueError, match=message):
        MarketKnobs(**values)
    with pytest.raises(ValueError, match=message):
        PluginConfig.of(policy="dfs-auction", **values)
    with pytest.raises(ValueError, match=message):
        ServerOptions.of(**values)


def test_the_reserve_changes_through_the_same_check() -> None:
    knobs = MarketKnobs(reserve=0.25)
    assert knobs.with_reserve(1).reserve == 1.0 and isinstance(knobs.with_reserve(1).reserve, float)
    with pytest.raises(ValueError, match="reserve must be >= 0"):
        knobs.with_reserve(-1)
    engine = Engine(knobs=knobs)
    engine.set_reserve(0.5)
    assert engine.reserve == 0.5 and engine.knobs.market == "default"
    with pytest.raises(ValueError, match="reserve must be a finite number"):
        engine.set_reserve("free")
    assert engine.reserve == 0.5  # a refused change leaves the one in effect


def test_the_wait_bound_changes_through_the_same_check_and_runs_under_the_dfs_auctions() -> None:
    knobs = MarketKnobs()
    assert knobs.wait_bound_s == 0.0 and knobs.age_credit("dfs-auction-density") is None  # off
    on = knobs.with_wait_bound(30)
    assert on.wait_bound_s == 30.0 and isinstance(on.wait_bound_s, float)
    rule = on.age_credit("dfs-auction-kv")
    # The defaults chosen on the KV sweep (mechanism.aging): 8 steps, $0.003/s per token.
    assert (rule.wait_s, rule.steps, rule.density) == (30.0, 8, 0.003)
    for policy in ("fcfs", "lpm", "dfs-weight", "highest-bid"):
        assert on.age_credit(policy) is None  # only the DFS auctions' keys take a credit
    with pytest.raises(ValueError, match="wait bound"):
        on.with_wait_bound(0.1)
    engine = Engine(knobs=on)
    engine.set_wait_bound(0)
    assert engine.knobs.wait_bound_s == 0.0
    with pytest.raises(ValueError, match="wait bound"):
        engine.set_wait_bound(-5)
    assert engine.knobs.wait_bound_s == 0.0  # a refused change leaves the one in effect
    assert assigned(MarketKnobs(), ["wait_bound_s=12.5"], what="knob").wait_bound_s == 12.5


def test_the_plan_rate_is_the_knob_or_the_engines_estimate() -> None:
    config = EngineConfig()
    # The cost model's long-prefill rate, worked out by hand: one chunk of n tokens from scratch.
    n = config.chunked_prefill_size
    step = (
        config.step_fixed_s + n * config.prefill_token_s + n * (n / 2) * config.prefill_attention_s
    )
    assert Engine(config).tokens_per_second == pytest.approx(n / step)
    assert Engine(config, knobs=MarketKnobs(tokens_per_second=5000.0)).tokens_per_second == 5000.0
    assert PluginConfig().tokens_per_second == DEFAULT_TOKENS_PER_SECOND
    assert PluginConfig.of(tokens_per_second=5000.0).tokens_per_second == 5000.0


def test_overrides_reach_the_knobs_or_the_engine_config_by_name() -> None:
    config, knobs = settings_split(
        ["overhead_tokens=3", "max_running_requests=7", "book_interval_s=none"], MarketKnobs()
    )
    assert (knobs.overhead_tokens, knobs.book_interval_s) == (3, None)
    assert config.max_running_requests == 7
    with pytest.raises(ValueError, match="unknown engine setting 'warp=1'"):
        settings_split(["warp=1"], MarketKnobs())
    with pytest.raises(ValueError, match="setting lpm_fcfs_fallback needs a bool"):
        assigned(EngineConfig(), ["lpm_fcfs_fallback=maybe"], what="engine")


def test_flat_keys_split_into_the_knobs_and_the_rest(tmp_path) -> None:
    knobs, rest = split_knobs({"reserve": 0.1, "redis_url": "redis://x/0", "market": "m"})
    assert knobs == MarketKnobs(reserve=0.1, market="m") and rest == {"redis_url": "redis://x/0"}
    path = tmp_path / "market.json"
    path.write_text('{"policy": "dfs-auction", "in_batch_defer_tokens": 0, "engine_id": "g1"}')
    config = config_from_env({"MARKET_PLUGIN_CONFIG": str(path)})
    assert config.knobs == MarketKnobs(in_batch_defer_tokens=0) and config.engine_id == "g1"
