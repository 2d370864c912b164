"""Round cost of the wait bound (aging.py): ``python -m mechanism.aging_bench``.

On the mechanism bench's queue (bench.make_queue), two maintained trees side by side in one run:

- the policy (``--policy``, the product's default unless said): a round after ``--changed``
  percent of the requests (1% unless said) changed their bid since the last,
- the same policy with the wait bound: a round after the ``AgeClock`` moved on far enough that
  about as many requests crossed a credit step (the clock's own work timed with the round),

each timed up to the order (``order``) and with every charge (``+pay``), as the median of
several repetitions that interleave the two; reported in milliseconds and as the ratio of the
bound's round to the plain one's.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from . import RequestTree, clear_tree
from .aging import AgeClock, AgeCredit
from .bench import RESERVE, make_queue
from .policies import DEFAULT_POLICY, DFS_AUCTIONS

# 4 steps of 1 s each; the bench's arrivals come 1,000 a second, so while all four steps are
# under way (from 4 s after the first arrival) each step crosses 1,000 requests a second: in all,
# one request crosses a step every 1/4,000 s of the clock.
RULE = AgeCredit(wait_s=4.0, density=0.002, steps=4)
ARRIVALS_PER_S = 1_000  # bench.make_queue: request i arrives at i x 0.001 s


def bench(
    n: int, groups: int, repeat: int, policy: str = DEFAULT_POLICY, changed_pct: float = 1.0
) -> dict[str, dict[str, float]]:
    """Median seconds per round kind, plain and with the bound, ``changed_pct`` percent of the
    requests changed (bids, or credit steps crossed) per round."""
    rng = random.Random(n)
    reqs = make_queue(n, groups)
    plain = RequestTree(reqs)
    aged = RequestTree(reqs)
    clock = AgeClock(RULE)
    for r in reqs:
        clock.admit(r.id, r.arrival)
    span = n / ARRIVALS_PER_S
    now = min(span, RULE.wait_s) + 0.5  # all steps under way for the arrivals so far
    clock.advance(aged, now)
    changes = max(1, round(n * changed_pct / 100))
    crossing_rate = RULE.steps * ARRIVALS_PER_S  # steps crossed per clock second
    ids = list(plain.entries)
    times: dict[str, dict[str, list[float]]] = {
        k: {"order": [], "+pay": [], "crossed": []} for k in ("plain", "bound")
    }
    for _ in range(repeat):
        for kind in ("order", "+pay"):
            clear_tree(plain, policy, reserve=RESERVE)  # the last round, then the changes
            for rid in rng.sample(ids, changes):
                plain.update(rid, bid=rng.lognormvariate(-2, 1))
            t0 = time.perf_counter()
            c = clear_tree(plain, policy, reserve=RESERVE)
            _ = c.order if kind == "order" else c.payments
            times["plain"][kind].append(time.perf_counter() - t0)

            clear_tree(aged, policy, reserve=RESERVE)
            now += changes / crossing_rate
            t0 = time.perf_counter()
            crossed = clock.advance(aged, now)
            c = clear_tree(aged, policy, reserve=RESERVE)
            _ = c.order if kind == "order" else c.payments
            times["bound"][kind].append(time.perf_counter() - t0)
            times["bound"]["crossed"].append(crossed)
            times["plain"]["crossed"].append(changes)
    return {k: {m: statistics.median(v) for m, v in per.items()} for k, per in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000, help="waiting requests")
    parser.add_argument("--groups", type=int, default=256, help="shared system prompts")
    parser.add_argument("--repeat", type=int, default=15, help="repetitions (median)")
    parser.add_argument("--policy", choices=sorted(DFS_AUCTIONS), default=DEFAULT_POLICY)
    parser.add_argument(
        "--changed", type=float, default=1.0, help="percent of the requests changed per round"
    )
    args = parser.parse_args(argv)
    if not 0 < args.changed <= 100:
        parser.error(f"--changed must be in (0, 100] percent, got {args.changed:g}")
    got = bench(args.size, args.groups, args.repeat, args.policy, args.changed)
    plain, bound = got["plain"], got["bound"]
    print(
        f"{args.size:,} waiting, {args.groups} system prompts, {args.policy}, ${RESERVE}/s reserve"
    )
    print(f"changed per round (median): bids {plain['crossed']:.0f}, steps {bound['crossed']:.0f}")
    for kind in ("order", "+pay"):
        print(
            f"{args.changed:g}% changed, {kind:>5}: plain {plain[kind] * 1e3:.1f} ms, "
            f"with the bound {bound[kind] * 1e3:.1f} ms: {bound[kind] / plain[kind]:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
