"""The plugin follows SGLang's radix cache instead of matching every waiting request per round.

On SGLang's real ``RadixCache`` (paged and not, with a real KV allocator that eviction frees
into), inserts and evictions are driven between rounds as the scheduler drives them; after every
round each waiting request's cached length in the market's tree must equal a fresh
``match_prefix`` of its tokens (capped as SGLang caps it), and the order and charges must equal
a round of the mechanism on the queue built afresh from those matches.
"""

from __future__ import annotations

import random
from array import array

import pytest
import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

from engines.sglang_plugin import cache_tracking
from mechanism import clear

from .helpers import PromptSource, make_req, market_policy, tokens_of, waiting_requests


def paged_pool(size: int, page: int) -> RadixCache:
    allocator = PagedTokenToKVPoolAllocator(
        size=size, page_size=page, dtype=torch.int64, device="cpu", kvcache=None, need_sort=False
    )
    return RadixCache.create_simulated(mock_allocator=allocator, page_size=page)


def insert(cache: RadixCache, tokens) -> None:
    """Insert the page-aligned part of ``tokens`` with real KV slots, as a finished (or chunked)
    request's ``cache_finished_req`` does; evict first if the pool is short."""
    page = cache.page_size
    n = len(tokens) // page * page
    if n == 0:
        return
    allocator = cache.token_to_kv_pool_allocator
    value = allocator.alloc(n)
    if value is None:
        cache.evict(EvictParams(num_tokens=n))
        value = allocator.alloc(n)
        if value is None:
            return
    result = cache.insert(InsertParams(key=RadixKey(array("q", tokens[:n])), value=value))
    # The slots of the part already cached are duplicates: free them, as SGLang does.
    if result.prefix_len:
        allocator.free(value[: result.prefix_len])


def fresh_match(cache: RadixCache, req) -> int:
    tokens = tokens_of(req)
    match = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))
    return min(match.device_prefix_len, req._compute_max_prefix_len(len(tokens)))


@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("seed", range(8))
def test_followed_cached_lengths_equal_a_fresh_match_after_every_round(page, seed) -> None:
    rng = random.Random(seed)
    source = PromptSource(rng, unique_tail=rng.random() < 0.5)
    cache = paged_pool(rng.choice([256, 600, 4096]), page)
    policy = rng.choice(["dfs-auction", "dfs-auction-density"])
    reserve = rng.choice([0.0, 0.5])
    pol, _ = market_policy(policy, cache, reserve=reserve, overhead_tokens=rng.choice([0, 8]))
    market = pol.market
    assert market.tracker is not None
    queue: list = []
    made = 0
    for step in range(30):
        for _ in range(rng.choice([0, 1, 4, 12])):
            made += 1
            queue.append(
                make_req(
                    f"r{seed}-{made}",
                    source.prompt(),
                    bid=rng.choice([0.0, 0.25, 1.0, 3.0]),
                    arrival=1.0 + step,
                )
            )
        for _ in range(rng.randint(0, 4)):  # the cache changes between rounds
            what = rng.random()
            if what < 0.45 and queue:  # a waiting prompt's prefix (a chunk), or all of it
                p = list(rng.choice(queue).origin_input_ids)
                insert(cache, p[: rng.randint(1, len(p))])
            elif what < 0.7:
                insert(cache, source.prompt())
            elif what < 0.97:
                cache.evict(EvictParams(num_tokens=rng.randint(1, 300)))
            else:
                cache.reset()
        if queue and rng.random() < 0.2:  # a client went away
            queue.pop(rng.randrange(len(queue)))
        pol.calc_priority(queue)
        for req in queue:
            assert market.tree.get(req.rid).cached_len == fresh_match(cache, req), req.rid
            assert req.num_matched_prefix_tokens == market.tree.get(req.rid).cached_len
        expected = clear(
            waiting_requests(queue, cache), policy, reserve=reserve,
            overhead_tokens=market.config.knobs.overhead_tokens,
        )  # fmt: skip
        assert [r.rid for r in queue] == expected.order
        for rid in expected.order[:3]:
            assert market.clearing.charge(rid) == expected.charge(rid)
        k = rng.randint(0, min(5, len(queue)))
        if k:  # admitted: its prefill's evictions happen while the round is priced
            cache.evict(EvictParams(num_tokens=rng.randint(0, 50)))
            market.finish_round(queue[:k])
            for req in queue[:k]:
                assert req.rid not in market.tree
                insert(cache, tokens_of(req))  # its prompt, cached when it finishes
            del queue[:k]
    assert market.tracker.applied > 0


def test_a_request_in_another_cache_namespace_is_matched_every_round() -> None:
    cache = paged_pool(4096, 1)
    pol, _ = market_policy("dfs-auction", cache)
    lora = make_req("lora", [1, 2, 3, 4, 5], bid=1.0, arrival=1.0)
    lora.extra_key = "adapter-7"
    plain = make_req("plain", [1, 2, 3, 4, 6], bid=1.0, arrival=2.0)
    queue = [lora, plain]
    pol.calc_priority(queue)
    assert "lora" in pol.market._rematch and "plain" in pol.market._caps
    key = RadixKey(array("q", [1, 2, 3, 4]), extra_key="adapter-7")
    value = cache.token_to_kv_pool_allocator.alloc(4)
    cache.insert(InsertParams(key=key, value=value))  # only the adapter's namespace
    pol.calc_priority(queue)
    assert pol.market.tree.get("lora").cached_len == 4
    assert pol.market.tree.get("plain").cached_len == 0


def test_a_cache_it_cannot_follow_is_matched_every_round_as_sglang_does() -> None:
    class OtherCache(RadixCache):
        """Some other cache (HiCache, SWA, ...): its changes are not followed."""

    cache = RadixCache.create_simulated()
    cache.__class__ = OtherCache
    assert cache_tracking.supported(cache) is not None
    pol, _ = market_policy("dfs-auction", cache)
    assert pol.market.tracker is None
    queue = [make_req("a", [1, 2, 3], bid=1.0, arrival=1.0)]
    pol.calc_priority(queue)
    cache.insert(InsertParams(key=RadixKey(array("q", [1, 2]))))
    pol.calc_priority(queue)
    assert pol.market.tree.get("a").cached_len == 2


def test_the_pinned_sglangs_radix_cache_has_the_private_surface_the_tracker_wraps() -> None:
    """Fails loudly on a SGLang whose radix cache changed what the tracker relies on (its
    private ``_delete_leaf`` above all): the plugin would then stop following the cache."""
    assert cache_tracking.surface_problem() is None
    assert cache_tracking.supported(RadixCache.create_simulated()) is None


def test_a_changed_private_surface_switches_the_tracking_off_and_says_why(monkeypatch) -> None:
    class Renamed(RadixCache):
        _delete_leaf = None  # as if SGLang had renamed it

    class Reshaped(RadixCache):
        def _delete_leaf(self, node, evicted):  # a new parameter
            raise AssertionError("never called")

    assert cache_tracking.surface_problem(Renamed) == "RadixCache._delete_leaf is gone"
    assert cache_tracking.surface_problem(Reshaped) == (
        "RadixCache._delete_leaf takes ('node', 'evicted'), not ('node',)"
    )
    monkeypatch.setattr(
        cache_tracking, "surface_problem", lambda: "RadixCache._delete_leaf is gone"
    )
    why = cache_tracking.supported(RadixCache.create_simulated())
    assert why is not None and "_delete_leaf is gone" in why
    pol, _ = market_policy("dfs-auction", RadixCache.create_simulated())
    assert pol.market.tracker is None  # matched every round, as SGLang does


def test_waiting_prefixes_are_not_matched_each_round_but_the_head_is_touched_every_32() -> None:
    cache = paged_pool(4096, 1)
    pol, _ = market_policy("dfs-auction", cache)
    insert(cache, [1] * 20)  # the prefix of the high bid, first in the order
    insert(cache, [2] * 20)
    nodes = {node.key.token_ids[0]: node for node in cache.root_node.children.values()}
    queue = [
        make_req("low", [2] * 20 + [7], bid=0.1, arrival=1.0),
        make_req("high", [1] * 20 + [8], bid=5.0, arrival=2.0),
    ]
    pol.calc_priority(queue)  # matched on arrival; the first round refreshes the head
    assert [r.rid for r in queue] == ["high", "low"]
    for node in nodes.values():
        node.last_access_time = 0.0
    for _ in range(31):  # no request is matched again: the cache is not touched
        pol.calc_priority(queue)
    assert [n.last_access_time for n in nodes.values()] == [0.0, 0.0]
    pol.calc_priority(queue)  # the 33rd round: the head's prefixes touched, the head last
    assert nodes[1].last_access_time >= nodes[2].last_access_time > 0.0
