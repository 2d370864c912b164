"""Scheduler cost of the auction: ``calc_priority`` of the plugin against SGLang's own.

    python -m benchmarks.sglang_plugin [--sizes 1000 10000] [--reps 7]

(in the venv with SGLang, e.g. ``.venv-sglang/bin/python``). For each queue size it builds one
waiting queue of real SGLang requests, shaped like the generated-shared-prefix workload (groups
sharing a system prompt, some groups cached), over two identical radix caches, and times, on
the same queue, interleaved repetition by repetition after one warm-up call each:

- SGLang's ``dfs-weight`` ``calc_priority`` (its cheapest cache-aware policy without a 128-request
  fallback): prefix match of every request, in-batch check, DFS over the cache tree;
- the plugin's ``dfs-auction-density`` ``calc_priority`` (prefix match of every request through
  SGLang's ``match_kv_cache``, the incremental request tree's diff, one auction round), plus the
  charges of the first ``--admitted`` requests of the order, as a round that admits them prices.

Reported: medians in milliseconds, the ratio plugin / SGLang (below 1: the plugin is cheaper)
and, of the plugin's time, the auction alone (``clear_tree`` and the charges). CPU only.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import random
import statistics
import time
import warnings
from array import array

SYSTEM_TOKENS = 256  # per group's shared system prompt
USER_TOKENS = (32, 160)  # per request's own part, min and max
GROUPS_PER_1000 = 32


def _queue(n: int, seed: int):
    """Requests in arrival order, and the token sequences to cache (every other group)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    rng = random.Random(seed)
    groups = max(1, n * GROUPS_PER_1000 // 1000)
    systems = [[rng.randrange(32_000) for _ in range(SYSTEM_TOKENS)] for _ in range(groups)]
    reqs = []
    for i in range(n):
        g = rng.randrange(groups)
        user = [rng.randrange(32_000) for _ in range(rng.randint(*USER_TOKENS))]
        req = Req(
            rid=f"bench-{i}",
            origin_input_text="",
            origin_input_ids=array("q", systems[g] + user),
            sampling_params=SamplingParams(
                max_new_tokens=64, custom_params={"bid": round(rng.expovariate(1.0), 3)}
            ),
        )
        req.time_stats.set_wait_queue_entry_time(i + 1.0)
        reqs.append(req)
    return reqs, systems[::2]


def _cache(cached: list[list[int]]):
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    cache = RadixCache.create_simulated()
    for tokens in cached:
        cache.insert(InsertParams(key=RadixKey(array("q", tokens))))
    return cache


def _timed(fn) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def bench_size(n: int, *, reps: int, admitted: int, seed: int) -> dict[str, float]:
    """Median milliseconds of each ``calc_priority`` on one queue of ``n`` requests."""
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    from engines.sglang_plugin.config import PluginConfig
    from engines.sglang_plugin.policy import AuctionSchedulePolicy
    from scheduler_bridge.contract.sinks import MemorySink

    reqs, cached = _queue(n, seed)
    sglang = SchedulePolicy("dfs-weight", _cache(cached), False, False, False)
    config = PluginConfig(policy="dfs-auction-density")
    ours = AuctionSchedulePolicy(
        "fcfs", _cache(cached), False, False, False, market_config=config, sink=MemorySink()
    )
    market = ours.market
    assert market is not None
    q_sglang, q_ours = list(reqs), list(reqs)

    def price_admitted(clearing) -> None:
        """What a round that admits the front of the order works out for each admitted."""
        for rid in clearing.order[:admitted]:
            clearing.charge(rid)
            clearing.time_saved(rid)

    def run_sglang() -> None:
        sglang.calc_priority(q_sglang)

    def run_ours() -> None:
        ours.calc_priority(q_ours)
        price_admitted(market.clearing)

    def run_auction() -> None:
        price_admitted(market.clear())

    run_sglang()  # warm-up: the plugin builds its request tree here
    run_ours()
    times: dict[str, list[float]] = {"sglang": [], "ours": [], "auction": []}
    for _ in range(reps):
        times["sglang"].append(_timed(run_sglang))
        times["ours"].append(_timed(run_ours))
        times["auction"].append(_timed(run_auction))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "requests": n,
        "sglang_dfs_weight_ms": med["sglang"],
        "plugin_dfs_auction_density_ms": med["ours"],
        "ratio": med["ours"] / med["sglang"],
        "auction_ms": med["auction"],
    }


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table (and JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--reps", type=int, default=7, help="repetitions per size (median)")
    parser.add_argument("--admitted", type=int, default=64, help="charges computed per round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from sglang.srt.runtime_context import get_context

    get_context().override_server_args().install()
    rows = [
        bench_size(n, reps=args.reps, admitted=args.admitted, seed=args.seed) for n in args.sizes
    ]
    print(
        f"calc_priority, warm, median of {args.reps} (ms); plugin = dfs-auction-density "
        f"+ charges of the first {args.admitted}"
    )
    print(f"{'requests':>9} {'SGLang dfs-weight':>18} {'plugin':>10} {'ratio':>7} {'auction':>9}")
    for row in rows:
        print(
            f"{row['requests']:>9} {row['sglang_dfs_weight_ms']:>18.1f} "
            f"{row['plugin_dfs_auction_density_ms']:>10.1f} {row['ratio']:>7.2f} "
            f"{row['auction_ms']:>9.1f}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=2)


if __name__ == "__main__":
    main()
