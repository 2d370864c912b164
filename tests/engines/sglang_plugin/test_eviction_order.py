"""Under a DFS auction the plugin's radix cache evicts by the round's order, as the simulated
engine's does (engines.contract.eviction; tests/engines/sim/test_eviction_order.py runs the
same scenario on the simulated engine's cache and expects the same survivors).

The scenario, worked by hand: four system prompts of 40 tokens, A and C cached first, then B
and D (so A and C are the least recently used). Requests of group A (bid $4/s) and of group C
($1/s) wait; nobody waits for B or D. dfs-auction-density serves A's group, then C's. Asked for
80 tokens, SGLang's LRU would take A and C; by the order it takes B and D, which nobody needs.
Asked for 40 more it takes C, whose requests come after A's.
"""

from __future__ import annotations

import pytest
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from .helpers import cache_insert, cached_prefix, kv_pool, make_req, market_policy

SYSTEM = 40


def prompt(group: int, own: int = 0) -> list[int]:
    """Group ``group``'s system prompt, then ``own`` tokens of the request's own."""
    base = 1_000 * (group + 1)
    return [base + i for i in range(SYSTEM)] + [base + 500 + own * 10 + i for i in range(own and 6)]


A, B, C, D = range(4)


def scenario(policy: str, **knobs: object):
    allocator, cache = kv_pool(4 * SYSTEM + 8)
    pol, _ = market_policy(policy, cache, **knobs)
    for g in (A, C):
        cache_insert(cache, prompt(g), allocator)
    queue = [make_req(f"a{i}", prompt(A, i + 1), bid=4.0, arrival=1.0 + i) for i in range(2)]
    queue += [make_req(f"c{i}", prompt(C, i + 1), bid=1.0, arrival=3.0 + i) for i in range(2)]
    pol.calc_priority(queue)
    for g in (B, D):  # cached after the waiting requests were matched: more recently used
        cache_insert(cache, prompt(g), allocator)
    return pol, cache, queue


def survivors(cache) -> set[int]:
    return {g for g in (A, B, C, D) if cached_prefix(cache, prompt(g)) == SYSTEM}


@pytest.mark.parametrize("policy", ["dfs-auction-density", "dfs-auction-kv-split"])
def test_the_cache_evicts_what_nobody_waits_for_then_what_is_needed_last(policy) -> None:
    pol, cache, queue = scenario(policy)
    assert [r.rid for r in queue] == ["a0", "a1", "c0", "c1"]
    assert survivors(cache) == {A, B, C, D}
    cache.evict(EvictParams(num_tokens=2 * SYSTEM))
    assert survivors(cache) == {A, C}
    pol.calc_priority(queue)  # the next round: the ranks worked out again
    cache.evict(EvictParams(num_tokens=SYSTEM))
    assert survivors(cache) == {A}


def test_with_the_knob_off_the_cache_evicts_least_recently_used_first() -> None:
    _, cache, _ = scenario("dfs-auction-density", evict_by_order=False)
    cache.evict(EvictParams(num_tokens=2 * SYSTEM))
    assert survivors(cache) == {B, D}
