"""Bounded waiting (mechanism.aging) measured: the DFS auctions with and without the wait bound,
side by side with lpm, dfs-weight and highest-bid on the same arrivals, at several loads.

    python -m benchmarks.aging                      # chat workload, loads 0.8,1.0,1.2,1.5
    python -m benchmarks.aging --wait-s 3 --density 0.05 --steps 4 --loads 1.2

The bound is not a policy but a market knob (``MarketKnobs.wait_bound_s``, with ``wait_steps``
and ``wait_density``): the simulated engine runs it as it runs it live (``mechanism.aging
.WaitBound`` before each round), and the charges are the DFS auctions' own (payments.py keeps
the credit apart from the bids). Each cell is a ratio to lpm's
figure at the same load, except the goal's columns (benchmarks.goal): mean TTFT over the better
of lpm's and dfs-weight's, hit rate minus lpm's in percentage points, and capture.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from engines.contract.knobs import MarketKnobs
from engines.sim import EngineConfig
from mechanism.aging import DEFAULT_DENSITY, DEFAULT_STEPS

from .goal import goals
from .html import command_line
from .metrics import ratio
from .options import floats
from .runner import Capacities, run_point, simulate
from .workloads import chat

BASELINES = ("lpm", "dfs-weight", "highest-bid")
AUCTIONS = ("dfs-auction-density", "dfs-auction-kv-split")  # the auctions the market offers
BOUNDED = " +wait"  # the label of an auction run with the wait bound
DESCRIPTION = "The DFS auctions with and without the wait bound, on the chat workload."


def _x(value: float, base: float, digits: int) -> str:
    """``value`` as a ratio to ``base``: ``x1.23``."""
    return "x" + format(ratio(value, base), f".{digits}f")


def run(args: argparse.Namespace) -> str:
    """Every load's runs, as one table of ratios."""
    workload = chat(
        num_requests=args.chat_requests,
        conversations=args.chat_conversations,
        median_len=args.chat_median_len,
        sigma=args.chat_sigma,
        seed=args.seed,
    )
    bound = MarketKnobs(wait_bound_s=args.wait_s, wait_density=args.density, wait_steps=args.steps)
    config = EngineConfig()
    capacities = Capacities()
    lines = [
        workload.title,
        f"wait bound: {bound.wait_bound_s:g} s in {bound.wait_steps} steps, credit "
        f"${bound.wait_density:g}/s per prompt token at the bound",
        "ratios to lpm at the same load; goal: mean TTFT / best(lpm, dfs-weight), hit - lpm "
        "(pp), capture of highest-bid's welfare gain",
        f"{'load':>5} {'policy':<26} {'p99 TTFT':>9} {'mean TTFT':>9} {'hit':>7} "
        f"{'vs best':>8} {'hit pp':>7} {'capture':>8} {'lpm p99 s':>9}",
    ]
    for load in args.loads:
        point = run_point(
            workload, [*BASELINES, *AUCTIONS], config, load=load, seed=args.seed,
            capacities=capacities,
        )  # fmt: skip
        for policy in AUCTIONS:
            point.runs[policy + BOUNDED] = simulate(point.workload, policy, config, knobs=bound)
        metrics = {name: r.metrics for name, r in point.runs.items()}
        priced = [p for p in metrics if p not in BASELINES or p == "highest-bid"]
        goal = goals(metrics, priced)
        base = metrics["lpm"]
        for name, m in metrics.items():
            g = goal.get(name)
            lines.append(
                f"{load:>5g} {name:<26} {_x(m.p99_ttft_s, base.p99_ttft_s, 2):>9} "
                f"{_x(m.mean_ttft_s, base.mean_ttft_s, 2):>9} "
                f"{_x(m.cache_hit_rate, base.cache_hit_rate, 3):>7} "
                + (
                    f"{'x' + format(g.ttft_vs_best, '.2f'):>8} {g.hit_gap_pp:>+7.2f} "
                    f"{g.capture:>8.2f}"
                    if g is not None
                    else f"{'-':>8} {'-':>7} {'-':>8}"
                )
                + f" {base.p99_ttft_s:>9.3f}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.aging", description=DESCRIPTION)
    p.add_argument("--loads", type=floats, default=(0.8, 1.0, 1.2, 1.5), help="x capacity")
    p.add_argument("--wait-s", type=float, default=8.0, help="wait bound, seconds")
    p.add_argument(
        "--density", type=float, default=DEFAULT_DENSITY, help="$/s per prompt token at the bound"
    )
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    p.add_argument("--chat-requests", type=int, default=2048)
    p.add_argument("--chat-conversations", type=int, default=256)
    p.add_argument("--chat-median-len", type=int, default=256, help="tokens")
    p.add_argument("--chat-sigma", type=float, default=1.25)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        print(run(args))
    except ValueError as exc:
        p.error(str(exc))
    print(f"\ncommand: {command_line('benchmarks.aging', argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
