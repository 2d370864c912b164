"""Round-cost benchmark of the mechanism: ``python -m mechanism.bench``.

Waiting queues shaped like real traffic: G shared system prompts of about 2,000 tokens (a Zipf mix
of popularity), each request a distinct suffix of about 128 tokens, half of the system prompts
already cached. For each queue size and policy it times, on the same queue:

- ``order``: one round on the maintained tree worked out in full (what the DFS auctions keep in
  the nodes between rounds forgotten first), up to the service order,
- ``plan``: the same round with the planned completion of every waiting request (the work model of
  docs/mechanism.md, "Requests, the request tree and work"; bid-blind policies work it out on
  demand, so only this column charges them for it),
- ``plan+pay``: the plan plus the priority charge of every waiting request,
- ``clear``: ``clear()`` from scratch (building the tree included), up to the order,
- ``1% changed``: a round on the maintained tree after 1% of the requests changed their bid
  since the last one (the DFS auctions work out again only the subtrees that changed),

as the median of several repetitions, and reports each as a ratio to fcfs on the same tree in the
same run, since the machine is shared and absolute times drift.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable

from . import POLICIES, Clearing, RequestTree, WaitingRequest, clear, clear_tree

SIZES = (1_000, 10_000, 100_000)
# The kinds of round timed (the module's list), as the JSON keys them and the table names them.
KINDS = (
    ("order_s", "order"),
    ("plan_s", "plan"),
    ("plan_pay_s", "plan+pay"),
    ("clear_s", "clear"),
    ("changed_s", "1% changed"),
)
RESERVE = 0.05  # dollars per second: about a sixth of the background bids fall under it
GROUPS = {1_000: 64, 10_000: 256, 100_000: 1_024}


def make_queue(n: int, groups: int, seed: int = 0) -> list[WaitingRequest]:
    """``n`` waiting requests over ``groups`` shared system prompts."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(groups):
        length = int(rng.gauss(2_000, 200))
        prompts.append(tuple(rng.randrange(32_000) for _ in range(length)))
    cached = [rng.random() < 0.5 for _ in range(groups)]
    weights = [1 / (g + 1) for g in range(groups)]
    picks = rng.choices(range(groups), weights=weights, k=n)
    out = []
    for i, g in enumerate(picks):
        suffix = tuple(rng.randrange(32_000) for _ in range(max(1, int(rng.gauss(128, 32)))))
        bid = rng.lognormvariate(1.0, 1.0) if rng.random() < 0.2 else rng.lognormvariate(-2, 1)
        system = prompts[g]
        out.append(
            WaitingRequest(
                f"r{i}",
                system + suffix,
                bid,
                i * 0.001,
                cached_len=len(system) if cached[g] else 0,
            )
        )
    return out


def bench_size(
    n: int, groups: int, repeat: int, progress: Callable[[str], None]
) -> dict[str, dict[str, float]]:
    """Median seconds per policy and kind of round; repetitions interleave the policies, so that
    a slow spell of the machine falls on all of them alike."""
    reqs = make_queue(n, groups)
    tree = RequestTree(reqs)

    def plan(p: str) -> Clearing:
        c = clear_tree(tree, p, reserve=RESERVE)
        _ = c.completion  # the plan: every planned completion
        return c

    runs: dict[str, Callable[[str], object]] = {
        "order_s": lambda p: clear_tree(tree, p, reserve=RESERVE).order,
        "plan_s": plan,
        "plan_pay_s": lambda p: plan(p).payments,
        "clear_s": lambda p: clear(reqs, p, reserve=RESERVE).order,
        "changed_s": lambda p: clear_tree(tree, p, reserve=RESERVE).order,
    }
    nodes = tree.nodes()
    rng = random.Random(n)
    ids = list(tree.entries)
    times: dict[str, dict[str, list[float]]] = {p: {k: [] for k in runs} for p in POLICIES}
    for rep in range(repeat):
        progress(f"n={n:,} repetition {rep + 1}/{repeat}")
        for kind, fn in runs.items():
            if kind == "clear_s" and rep >= max(1, repeat // 3):
                continue
            for policy in POLICIES:
                if kind == "changed_s":
                    clear_tree(tree, policy, reserve=RESERVE)  # the last round, then changes
                    for rid in rng.sample(ids, max(1, n // 100)):
                        tree.update(rid, bid=rng.lognormvariate(-2, 1))
                elif kind != "clear_s":
                    for x in nodes:  # work the round out in full
                        x.memo = None
                t0 = time.perf_counter()
                fn(policy)
                times[policy][kind].append(time.perf_counter() - t0)
    return {p: {k: statistics.median(v) for k, v in per.items()} for p, per in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--repeat", type=int, default=9, help="repetitions per timing (median)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)

    def progress(msg: str) -> None:
        print(f"  ... {msg}", file=sys.stderr, flush=True)

    results = {}
    for n in args.sizes:
        groups = GROUPS.get(n, max(64, min(1_024, n // 64)))
        repeat = args.repeat if n <= 10_000 else max(1, args.repeat // 2)
        results[n] = bench_size(n, groups, repeat, progress)

    kinds = tuple(k for k, _ in KINDS)
    names = tuple(name for _, name in KINDS)
    head = f"{'requests':>9} {'policy':<20}" + "".join(f"{n + ' ms':>15}" for n in names)
    head += "".join(f"{n + '/fcfs':>17}" for n in names)
    print(head)
    for n, per in results.items():
        base = per["fcfs"]
        for policy, t in per.items():
            print(
                f"{n:>9,} {policy:<20}"
                + "".join(f"{t[k] * 1e3:>15.1f}" for k in kinds)
                + "".join(f"{t[k] / base[k]:>17.2f}" for k in kinds)
            )
    sizes = list(results)
    for a, b in zip(sizes, sizes[1:], strict=False):
        for policy in ("fcfs", "dfs-auction-density"):
            ra = results[a][policy]["plan_pay_s"]
            rb = results[b][policy]["plan_pay_s"]
            print(
                f"scaling {policy} plan+pay {a:,} -> {b:,} requests: {rb / ra:.1f}x time "
                f"for {b / a:.0f}x requests"
            )
    for n, per in results.items():
        density = per["dfs-auction-density"]
        for policy in ("dfs-auction-kv", "dfs-auction-kv-split"):
            kv = per[policy]
            print(
                f"{policy} / dfs-auction-density at {n:,} requests: "
                + ", ".join(
                    f"{name} {kv[k] / density[k]:.2f}x"
                    for k, name in zip(kinds, names, strict=True)
                )
            )
    if args.json:  # what benchmarks.docs renders (docs/benchmarks.md's round-cost table)
        argv_used = sys.argv[1:] if argv is None else list(argv)
        with open(args.json, "w") as f:
            json.dump(
                {
                    "meta": {"argv": argv_used, "repeat": args.repeat},
                    "rounds": {str(n): per for n, per in results.items()},
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
