"""Scheduler cost of the auction: the plugin's round against SGLang's ``calc_priority``.

    python -m benchmarks.sglang_plugin [--sizes 1000 10000 100000] [--churn 0.01 0.1]
                                       [--rounds 5] [--wait-bound S] [--json FILE]

(in the venv with SGLang, e.g. ``.venv-sglang/bin/python``). For each queue size and churn it
builds one waiting queue of real SGLang requests, shaped like the generated-shared-prefix
workload (groups sharing a 256-token system prompt, every other group's cached), and runs rounds
as a busy scheduler sees them: between two rounds ``churn`` x size requests are admitted from
the front of the plugin's order (and leave every contender's queue), as many new ones arrive,
and the admitted prompts are inserted into the cache (as ``cache_finished_req`` does), a KV pool
(a real allocator) with room for twice the cached system prompts, so that after a few rounds
each insert evicts (SGLang's LRU) what it needs room for. Each policy has its own radix cache
(matching changes a cache's LRU state), driven by the same inserts. Timed per round, on the
same queue:

- ``plugin``: the market's round as the scheduler runs it: ``calc_priority`` (the queue's diff,
  the cache's changes since the last round applied to the tree, one dfs-auction-density round)
  and ``finish_round`` (the charges and the record of the admitted requests);
- ``plugin, every match``: the same with a cache the plugin does not follow, so that every
  waiting request is matched every round (the plugin's way before it followed the cache);
- ``SGLang dfs-weight``: SGLang's cheapest cache-aware ``calc_priority`` without a fallback;
- ``SGLang lpm``: as SGLang runs it (fcfs above 128 waiting requests) and without its fallback.

``--wait-bound S`` runs the plugin with the wait bound on (``wait_bound_s`` S, the other
knobs at their defaults) on the benchmark's clock: the requests arrive evenly, the rounds are
S x churn seconds apart, so that a request waits about the bound before it is admitted and
crosses every credit step on its way (the most credit changes a round: the steps x churn of the
queue); the plugin's rounds are told that time. 0 (the default): off, the requests stamped 1,
2, 3, ... and the rounds on SGLang's clock, as the plugin's tests run.

Reported: medians over ``--rounds`` rounds (after one warm-up round) in milliseconds and the
ratios to SGLang's dfs-weight in the same run (below 0.1: the goal), and the extra time the
plugin's cache wrapper adds to the cache's inserts and evictions. CPU only.
"""

from __future__ import annotations

import argparse
import gc
import logging
import random
import statistics
import sys
import time
import warnings
from array import array
from collections.abc import Callable

from .html import command_line, write_json

SYSTEM_TOKENS = 256  # per group's shared system prompt
USER_TOKENS = (32, 160)  # per request's own part, min and max
GROUPS_PER_1000 = 32
SIZES = (1_000, 10_000, 100_000)
CHURN = (0.01, 0.1)

COLUMNS = ("plugin", "plugin_every_match", "sglang_dfs_weight", "sglang_lpm", "sglang_lpm_full")
NAMES = {
    "plugin": "plugin",
    "plugin_every_match": "plugin, every match",
    "sglang_dfs_weight": "SGLang dfs-weight",
    "sglang_lpm": "SGLang lpm",
    "sglang_lpm_full": "lpm, no fallback",
}


class Workload:
    """The queue's requests (made as they arrive) and the cache's system prompts."""

    def __init__(self, n: int, seed: int, *, spacing: float = 1.0) -> None:
        self.rng = random.Random(seed)
        self.spacing = spacing  # seconds between two arrivals (the queue entry times)
        groups = max(1, n * GROUPS_PER_1000 // 1000)
        self.systems = [
            [self.rng.randrange(32_000) for _ in range(SYSTEM_TOKENS)] for _ in range(groups)
        ]
        self.made = 0

    def request(self):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        rng = self.rng
        self.made += 1
        system = self.systems[rng.randrange(len(self.systems))]
        user = [rng.randrange(32_000) for _ in range(rng.randint(*USER_TOKENS))]
        req = Req(
            rid=f"bench-{self.made}",
            origin_input_text="",
            origin_input_ids=array("q", system + user),
            sampling_params=SamplingParams(
                max_new_tokens=64, custom_params={"bid": round(rng.expovariate(1.0), 3)}
            ),
        )
        req.time_stats.set_wait_queue_entry_time(self.made * self.spacing)
        return req


def _cache(slots: int, *, followed: bool = True):
    """A radix cache over a real KV allocator of ``slots`` token slots (index tensors only)."""
    import torch
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.radix_cache import RadixCache

    allocator = PagedTokenToKVPoolAllocator(
        size=slots, page_size=1, dtype=torch.int64, device="cpu", kvcache=None, need_sort=False
    )
    cache = RadixCache.create_simulated(mock_allocator=allocator)
    if not followed:
        # Not SGLang's plain RadixCache class (as HiCache or SWA caches are not): the plugin
        # does not follow its changes and matches every waiting request every round.
        cache.__class__ = type("UnfollowedRadixCache", (RadixCache,), {})
    return cache


def _insert(cache, tokens) -> None:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    allocator = cache.token_to_kv_pool_allocator
    value = allocator.alloc(len(tokens))
    if value is None:
        cache.evict(EvictParams(num_tokens=len(tokens)))
        value = allocator.alloc(len(tokens))
    result = cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=value))
    if result.prefix_len:
        allocator.free(value[: result.prefix_len])


class Contender:
    """One policy: its own queue (the same requests) and its own cache."""

    def __init__(
        self,
        name: str,
        slots: int,
        wait_bound_s: float = 0.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        from sglang.srt.managers.schedule_policy import SchedulePolicy

        from engines.contract.knobs import MarketKnobs
        from engines.contract.sinks import MemorySink
        from engines.sglang_plugin.config import PluginConfig
        from engines.sglang_plugin.policy import AuctionSchedulePolicy

        self.name = name
        self.queue: list = []
        self.cache = _cache(slots, followed=name != "plugin_every_match")
        self.market = None
        if name.startswith("plugin"):
            config = PluginConfig(
                policy="dfs-auction-density", knobs=MarketKnobs(wait_bound_s=wait_bound_s)
            )
            self.policy = AuctionSchedulePolicy(
                "fcfs", self.cache, False, False, False, market_config=config, sink=MemorySink()
            )
            self.market = self.policy.market
            if clock is not None:  # the round's time on the benchmark's clock (the wait bound's)
                order = self.market.order
                self.market.order = lambda queue: order(queue, now=clock())  # type: ignore[method-assign]
        elif name == "sglang_dfs_weight":
            self.policy = SchedulePolicy("dfs-weight", self.cache, False, False, False)
        else:
            self.policy = SchedulePolicy("lpm", self.cache, False, False, False)
            if name == "sglang_lpm_full":
                policy = self.policy
                policy._determine_active_policy = lambda queue: policy.policy
        self.cache_s = 0.0  # time in the cache's inserts and evictions

    def round(self, admitted: int) -> float:
        """One timed round (the plugin's prices its first ``admitted``); returns its seconds."""
        gc.collect()
        start = time.perf_counter()
        self.policy.calc_priority(self.queue)
        if self.market is not None:
            self.market.finish_round(self.queue[:admitted])
        return time.perf_counter() - start

    def cache_changes(self, inserted: list) -> None:
        start = time.perf_counter()
        for tokens in inserted:
            _insert(self.cache, tokens)  # evicting what it needs room for
        self.cache_s += time.perf_counter() - start


def bench(
    n: int, churn: float, *, rounds: int, seed: int, progress, wait_bound_s: float = 0.0
) -> dict:
    """Median milliseconds per round of each contender at ``n`` waiting, ``churn`` per round
    (``wait_bound_s``: the plugin's wait bound, 0: off)."""
    step = max(1, round(n * churn))
    # With the bound: ``step`` arrivals a round, a round every wait_bound_s x churn seconds.
    work = Workload(n, seed, spacing=wait_bound_s * churn / step if wait_bound_s else 1.0)
    clock = (lambda: work.made * work.spacing) if wait_bound_s else None  # the last arrival's
    admitted = step
    # KV room for twice the cached system prompts: full after a few rounds, then each insert
    # evicts (SGLang's LRU) as much as it adds.
    slots = len(work.systems[::2]) * SYSTEM_TOKENS * 2
    contenders = [Contender(name, slots, wait_bound_s, clock) for name in COLUMNS]
    for tokens in work.systems[::2]:  # every other group's system prompt is cached
        for c in contenders:
            _insert(c.cache, tokens)
    first = [work.request() for _ in range(n)]
    for c in contenders:
        c.queue = list(first)
        c.cache_s = 0.0
    times: dict[str, list[float]] = {name: [] for name in COLUMNS}
    for r in range(rounds + 1):
        progress(f"n={n:,} churn={churn:g} round {r + 1}/{rounds + 1}")
        for c in contenders:
            elapsed = c.round(admitted)
            if r:  # the first round builds the plugin's tree: a warm-up
                times[c.name].append(elapsed)
        # The same requests leave every queue (the plugin's admitted batch) and as many new
        # ones arrive; the admitted prompts are cached.
        queue = contenders[0].queue
        batch = queue[:admitted]
        leaving = set(batch)
        arrivals = [work.request() for _ in range(len(leaving))]
        inserted = [list(req.origin_input_ids) for req in batch]
        for c in contenders:
            c.queue = [req for req in c.queue if req not in leaving] + arrivals
            c.cache_changes(inserted)
    med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    base = med["sglang_dfs_weight"]
    plugin = contenders[0]
    plain = contenders[COLUMNS.index("sglang_dfs_weight")]
    return {
        "requests": n,
        "churn": churn,
        "admitted_per_round": admitted,
        "rounds": rounds,
        "wait_bound_s": wait_bound_s,
        **{f"{name}_ms": med[name] for name in COLUMNS},
        **{f"{name}_ratio": med[name] / base for name in COLUMNS},
        "cache_changes_followed_ms": plugin.cache_s * 1e3 / (rounds + 1),
        "cache_changes_plain_ms": plain.cache_s * 1e3 / (rounds + 1),
        "changes_applied": plugin.market.tracker.applied,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table (and JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--churn", type=float, nargs="+", default=list(CHURN))
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per point (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--wait-bound", type=float, default=0.0, help="the plugin's wait bound, s (0: off)"
    )
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    if any(not 0 < c <= 1 for c in args.churn):
        parser.error("--churn: fractions of the queue in (0, 1]")

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from sglang.srt.runtime_context import get_context

    get_context().override_server_args().install()

    def progress(msg: str) -> None:
        print(f"  ... {msg}", file=sys.stderr, flush=True)

    rows = [
        bench(
            n,
            churn,
            rounds=args.rounds,
            seed=args.seed,
            progress=progress,
            wait_bound_s=args.wait_bound,
        )
        for n in args.sizes
        for churn in args.churn
    ]
    print(
        f"one scheduling round, median of {args.rounds} (ms), and / SGLang dfs-weight; plugin = "
        "dfs-auction-density, its admitted requests priced"
        + (f", wait bound {args.wait_bound:g} s" if args.wait_bound else "")
    )
    head = f"{'requests':>9} {'churn':>6}" + "".join(f"{NAMES[c]:>21}" for c in COLUMNS)
    print(head)
    for row in rows:
        cells = "".join(f"{row[c + '_ms']:>12.1f} {row[c + '_ratio']:>7.3f}x" for c in COLUMNS)
        print(f"{row['requests']:>9,} {row['churn']:>6.0%}{cells}")
    print("cache inserts and evictions per round (ms), plugin's followed cache / plain:")
    for row in rows:
        print(
            f"{row['requests']:>9,} {row['churn']:>6.0%} {row['cache_changes_followed_ms']:>9.2f}"
            f" / {row['cache_changes_plain_ms']:.2f}"
        )
    if args.json:
        meta = {"command": command_line("benchmarks.sglang_plugin", argv)}
        write_json(args.json, {"meta": meta, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
