"""Under a DFS auction the simulated engine's cache evicts by the round's order, as the SGLang
plugin's does (engines.contract.eviction): the scenario of
tests/engines/sglang_plugin/test_eviction_order.py, worked by hand there, on this engine's
cache, with the same survivors; and the engine's count of prompt tokens computed again after
an eviction.
"""

from __future__ import annotations

from engines.contract.eviction import waiting_ranks
from engines.sim import Engine, EngineConfig, SimRequest
from engines.sim.kvcache import KVCache
from mechanism import RequestTree, WaitingRequest, clear_tree

SYSTEM = 40
A, B, C, D = range(4)


def prompt(group: int, own: int = 0) -> tuple[int, ...]:
    base = 1_000 * (group + 1)
    mine = tuple(base + 500 + own * 10 + i for i in range(own and 6))
    return tuple(base + i for i in range(SYSTEM)) + mine


def survivors(kv: KVCache) -> set[int]:
    return {g for g in (A, B, C, D) if kv.match(prompt(g))[0] == SYSTEM}


def test_the_cache_evicts_what_nobody_waits_for_then_what_is_needed_last() -> None:
    kv = KVCache(4 * SYSTEM + 8)
    for g in (A, C):
        kv.insert(prompt(g), SYSTEM)
    waiting = [("a0", A, 1, 4.0), ("a1", A, 2, 4.0), ("c0", C, 1, 1.0), ("c1", C, 2, 1.0)]
    tree = RequestTree()
    ends = {}
    for i, (rid, g, own, bid) in enumerate(waiting):
        tokens = prompt(g, own)
        cached, ends[rid] = kv.match(tokens, len(tokens) - 1)
        tree.insert(WaitingRequest(rid, tokens, bid, 1.0 + i, cached))
    for g in (B, D):
        kv.insert(prompt(g), SYSTEM)
    order = clear_tree(tree, "dfs-auction-density").order
    assert order == ["a0", "a1", "c0", "c1"]
    ranks = waiting_ranks(ends[rid] for rid in order)
    kv.evict(2 * SYSTEM, ranks)
    assert survivors(kv) == {A, C}
    kv.evict(SYSTEM, waiting_ranks(ends[rid] for rid in order))
    assert survivors(kv) == {A}


def test_least_recently_used_first_without_ranks() -> None:
    kv = KVCache(4 * SYSTEM + 8)
    for g in (A, C):
        kv.insert(prompt(g), SYSTEM)
    kv.match(prompt(A, 1))
    kv.match(prompt(C, 1))
    for g in (B, D):
        kv.insert(prompt(g), SYSTEM)
    kv.evict(2 * SYSTEM)
    assert survivors(kv) == {B, D}


def test_the_engine_counts_prompt_tokens_computed_again_after_an_eviction() -> None:
    # Room for one 40-token prompt and its output at a time (max_running_requests=1): X, then
    # Y evicts X's prefix, then X's second request computes X's 39 matchable tokens again
    # (all but the last token, which is always computed).
    config = EngineConfig(kv_capacity_tokens=60, max_running_requests=1)
    engine = Engine(config, "fcfs")
    x, y = prompt(A), prompt(B)
    for i, tokens in enumerate((x, y, x)):
        engine.submit(SimRequest(f"r{i}", tokens, 2, arrival=float(i)))
    now = 0.0
    while (step := engine.step(now)) is not None:
        now = step.end
    assert engine.recomputed_prompt_tokens == SYSTEM - 1
