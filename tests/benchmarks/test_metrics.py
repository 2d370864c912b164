"""Metrics against hand-worked examples, and one engine run worked out from the cost model."""

from __future__ import annotations

import math

import pytest

from benchmarks.metrics import Served, by_class, percentile, ratio, summarize
from benchmarks.runner import simulate
from benchmarks.workloads import BenchRequest, Workload, agents
from engines.sim import EngineConfig


def _served(rid: str, bid: float, ttft: float, e2e: float, charge: float, cls: str) -> Served:
    return Served(rid, bid, cls, 0.0, ttft, e2e, charge)


def test_three_requests_by_hand() -> None:
    served = [
        _served("a", 3.0, 1.0, 2.0, 0.5, "urgent"),
        _served("b", 1.0, 2.0, 5.0, 0.25, "background"),
        _served("c", 0.5, 4.0, 5.0, 0.0, "background"),
    ]
    m = summarize(served, makespan_s=10.0, tokens=1234, cache_hit_rate=0.25)
    assert m.welfare == pytest.approx(-(3 * 1 + 1 * 2 + 0.5 * 4))  # -7 dollars
    assert m.mean_ttft_s == pytest.approx(7 / 3)
    assert m.p50_ttft_s == 2.0
    # p99: position 0.99 x 2 = 1.98 between 2 and 4
    assert m.p99_ttft_s == pytest.approx(2 + 0.98 * 2)
    assert m.mean_e2e_s == 4.0
    assert m.revenue == 0.75
    assert m.throughput_tokens_per_s == 123.4
    assert m.cache_hit_rate == 0.25
    classes = by_class(served)
    assert classes["urgent"]["mean_ttft_s"] == 1.0
    assert classes["background"]["mean_ttft_s"] == 3.0
    assert classes["background"]["requests"] == 2


def test_percentile_and_ratio_edges() -> None:
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert math.isnan(percentile([], 50))
    assert math.isnan(ratio(1.0, 0.0))
    assert ratio(3.0, 2.0) == 1.5


def test_one_request_alone_follows_the_cost_model() -> None:
    cfg = EngineConfig()
    req = BenchRequest("x", tuple(range(100)), 3, bid=2.0, bid_class="all", arrival=1.0)
    run = simulate(Workload("one", "one", (req,)), "dfs-auction", cfg)
    ttft = cfg.step_fixed_s + 100 * cfg.prefill_token_s + 100 * 50 * cfg.prefill_attention_s
    decodes = [
        cfg.step_fixed_s + cfg.decode_seq_s + ctx * cfg.decode_context_token_s for ctx in (101, 102)
    ]
    (s,) = run.served
    assert s.ttft_s == pytest.approx(ttft)
    assert s.e2e_s == pytest.approx(ttft + sum(decodes))
    assert run.makespan_s == pytest.approx(s.e2e_s)  # from the first arrival
    m = run.metrics
    assert m.welfare == pytest.approx(-2.0 * ttft)
    assert m.revenue == 0.0  # nobody to overtake
    assert m.throughput_tokens_per_s == pytest.approx(103 / s.e2e_s)
    assert m.cache_hit_rate == 0.0


def test_agent_turns_reuse_the_engine_output_and_wait_their_think_time() -> None:
    w = agents(sessions=1, turns=3, prefix_len=64, message_len=8, output_len=4, think_s=0.5)
    run = simulate(w, "lpm", EngineConfig())
    turns = sorted(run.served, key=lambda s: s.id)
    assert [s.id for s in turns] == ["a0000-t00", "a0000-t01", "a0000-t02"]
    think = w.sessions[0].think_s
    for k in (0, 1):
        finished = turns[k].arrival + turns[k].e2e_s
        assert turns[k + 1].arrival == pytest.approx(finished + think[k])
    # prompts 72, 84, 96 tokens; the engine caches prompt + output at the finish, so turns 1
    # and 2 find 76 and 88 tokens cached, which only happens if they carry the real output
    assert run.metrics.cache_hit_rate == pytest.approx((0 + 76 + 88) / (72 + 84 + 96))
