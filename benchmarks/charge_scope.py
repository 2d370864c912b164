"""What tenant-level charges change: ``python -m benchmarks.charge_scope`` (docs/mechanism.md,
"Tenant-level charges").

In the pacing benchmark's environment (``benchmarks.pacing``) and with no budget, the focal
tenant bids ``value / (1 + mu)`` for a few fixed ``mu``, once with per-request charges and once
with tenant-level ones (``charge_scope``). Reported per scope, as means over the seeds: what it
pays bidding its full values, its utility, and what shading gains over the full value (the mean
curve's best ``mu``). With truthful charges and nothing else in the way, the best ``mu`` without a
budget is 0; what is left with tenant-level charges is the gap between planned and realized
waiting (requests admitted in one prefill batch start together though the plan orders them).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace

from . import pacing
from .html import write_json
from .progress import Progress

MUS = (0.0, 0.25, 0.5, 1.0, 2.0)


def compare(
    *, seeds: Sequence[int], tenant: str, progress: Progress, base: pacing.Setup | None = None
) -> dict:
    """Per scope: the mean paid at full value, the mean utility at each mu, the best one."""
    result = {}
    for scope in ("request", "tenant"):
        setup = replace(base or pacing.Setup(), charge_scope=scope)
        paid, curves = [], []
        for seed in seeds:
            zero = pacing.run(pacing.Spec(seed, tenant, "zero"), setup)
            curve = {}
            for mu in MUS:
                progress.set_label(f"{scope} seed {seed} mu={mu:g}")
                strategy = "free" if mu == 0 else f"mu={mu:g}"
                out = pacing.run(pacing.Spec(seed, tenant, strategy), setup)
                curve[mu] = pacing.scored(out, zero).utility
                if mu == 0:
                    paid.append(out.paid)
                progress.advance()
            curves.append(curve)
        means = {mu: statistics.fmean(c[mu] for c in curves) for mu in MUS}
        best = max(means, key=means.get)
        result[scope] = {
            "free_paid_mean": statistics.fmean(paid),
            "utility_by_mu": means,
            "best_mu": best,
            "shading_gain": means[best] / means[0.0] - 1.0,
        }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="held-out seeds 100, 101, ...")
    parser.add_argument("--tenant", default="A", choices=pacing.TENANTS)
    parser.add_argument("--json", help="write the result to this file")
    args = parser.parse_args(argv)
    seeds = pacing.HELD_OUT_SEEDS[: args.seeds]
    bar = Progress(2 * len(seeds) * len(MUS), enabled=True)
    result = compare(seeds=seeds, tenant=args.tenant, progress=bar)
    bar.close()
    for scope, r in result.items():
        curve = "  ".join(f"mu={mu:g}: {u:.1f}" for mu, u in r["utility_by_mu"].items())
        print(
            f"{scope:8s} paid at full value ${r['free_paid_mean']:.2f}  utility {curve}  best "
            f"mu={r['best_mu']:g} ({r['shading_gain']:+.1%} over the full value)"
        )
    if args.json:
        out = {
            scope: {**r, "utility_by_mu": {f"{m:g}": u for m, u in r["utility_by_mu"].items()}}
            for scope, r in result.items()
        }
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
