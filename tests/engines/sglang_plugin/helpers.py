"""Builders for the SGLang plugin's tests: real SGLang requests, caches and random queues.

Everything here makes SGLang's own objects (``Req``, ``RadixCache``, the KV allocator); the
expected orders and charges are computed by mechanism from ``WaitingRequest``s that
``waiting_requests`` builds independently of the plugin (its own prefix match on the cache).
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterable, Sequence

import torch
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.sampling.sampling_params import SamplingParams

from engines.contract.sinks import MemorySink
from engines.sglang_plugin.config import PluginConfig
from engines.sglang_plugin.policy import AuctionSchedulePolicy
from mechanism import WaitingRequest

MISSING = object()  # a request without a bid


def make_req(
    rid: str,
    tokens: Sequence[int],
    *,
    bid: object = MISSING,
    arrival: float = 1.0,
    max_new_tokens: int = 16,
    priority: int | None = None,
) -> Req:
    """A real SGLang request as the scheduler queues it (entry time stamped at ``arrival``).

    ``arrival`` must be > 0: SGLang stamps the current ``perf_counter()`` for 0.
    """
    assert arrival > 0
    params = None if bid is MISSING else {"bid": bid}
    req = Req(
        rid=rid,
        origin_input_text="",
        origin_input_ids=array("q", tokens),
        sampling_params=SamplingParams(max_new_tokens=max_new_tokens, custom_params=params),
        priority=priority,
    )
    req.time_stats.set_wait_queue_entry_time(arrival)
    return req


def cache_insert(cache: RadixCache, tokens: Sequence[int], allocator=None) -> None:
    """Put a token sequence into SGLang's radix cache (with real KV slots if an allocator)."""
    if not tokens:
        return
    value = None if allocator is None else allocator.alloc(len(tokens))
    cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=value))


def cached_prefix(cache: RadixCache, tokens: Sequence[int]) -> int:
    """Tokens of ``tokens`` found in the cache, by SGLang's radix tree match (uncapped)."""
    match = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))
    return match.device_prefix_len


def kv_pool(size: int) -> tuple[PagedTokenToKVPoolAllocator, RadixCache]:
    """A real CPU KV allocator of ``size`` token slots and a radix cache that frees into it."""
    allocator = PagedTokenToKVPoolAllocator(
        size=size, page_size=1, dtype=torch.int64, device="cpu", kvcache=None, need_sort=False
    )
    return allocator, RadixCache.create_simulated(mock_allocator=allocator)


def bid_value(req: Req) -> float:
    """The bid the test gave the request (0 when it has none)."""
    params = req.sampling_params.custom_params or {}
    return float(params.get("bid", 0.0))


def tokens_of(req: Req) -> tuple[int, ...]:
    """Prompt plus output (a retracted request waits with both)."""
    return tuple(req.origin_input_ids) + tuple(req.output_ids)


def waiting_requests(
    queue: Iterable[Req], cache: RadixCache, *, capped: bool = True
) -> list[WaitingRequest]:
    """The queue as mechanism sees it, with cached lengths from a fresh match.

    ``capped``: at most all but the last token, as SGLang's ``num_matched_prefix_tokens``.
    """
    out = []
    for req in queue:
        tokens = tokens_of(req)
        cached = cached_prefix(cache, tokens)
        if capped:
            cached = min(cached, len(tokens) - 1)
        out.append(
            WaitingRequest(
                req.rid, tokens, bid_value(req), req.time_stats.wait_queue_entry_time, cached
            )
        )
    return out


def market_policy(
    policy: str, cache: RadixCache, **config: object
) -> tuple[AuctionSchedulePolicy, MemorySink]:
    """The plugin's policy object as SGLang's scheduler builds it, with an in-memory sink."""
    sink = MemorySink()
    pol = AuctionSchedulePolicy(
        "fcfs",
        cache,
        False,
        False,
        False,
        market_config=PluginConfig.of(policy=policy, **config),
        sink=sink,
    )
    return pol, sink


# --- random queues ---------------------------------------------------------------------------


class PromptSource:
    """Prompts that share prefixes: a few heads (5..40 tokens, some around SGLang's in-batch
    threshold of 32), bases that extend them, and prompts that cut a base and add a tail.

    ``unique_tail`` ends every prompt with a token of its own, so no prompt is a prefix of
    another and none can be cached whole.
    """

    def __init__(self, rng: random.Random, *, unique_tail: bool = True) -> None:
        self.rng = rng
        self.unique_tail = unique_tail
        self.count = 0
        heads = [
            [rng.randint(0, 2) for _ in range(rng.choice([5, 20, 31, 32, 33, 40]))]
            for _ in range(3)
        ]
        self.bases = [
            h + [rng.randint(0, 9) for _ in range(rng.randint(0, 40))]
            for h in heads
            for _ in range(3)
        ]

    def prompt(self) -> list[int]:
        """One prompt."""
        rng = self.rng
        base = rng.choice(self.bases)
        out = base[: rng.randint(0, len(base))] + [
            rng.randint(0, 3) for _ in range(rng.randint(1, 6))
        ]
        self.count += 1
        if self.unique_tail:
            out.append(1_000 + self.count)
        return out


def cache_in_arrival_order(
    cache: RadixCache, prompts: Sequence[Sequence[int]], rng: random.Random
) -> list[int]:
    """Cache a random prefix of some prompts so that the cache's child order is arrival order.

    SGLang breaks dfs-weight ties by the order in which the radix cache's children were
    created. Each prompt gets a random cached target; then the cache is rebuilt by inserting,
    in arrival order, each prompt's real match against those targets, so the request that
    created a child of the cache is the earliest-arriving request cached into it. Returns the
    cached length of each prompt.
    """
    scratch = RadixCache.create_simulated()
    for p in prompts:
        if rng.random() < 0.6:
            cache_insert(scratch, p[: rng.randint(1, len(p) - 1)])
    matched = [cached_prefix(scratch, p) for p in prompts]
    for p, m in zip(prompts, matched, strict=True):
        cache_insert(cache, p[:m])
    # Cached prompts of no waiting request: a first token of their own, so they hold no
    # waiting request's prefix.
    for k in range(rng.randint(0, 2)):
        cache_insert(cache, [500 + k] + [rng.randint(0, 3) for _ in range(rng.randint(1, 9))])
    return matched
