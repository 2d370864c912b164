"""How the automatic wait bound was chosen: the KV sweep at each candidate multiple of the mean
wait, credit density and number of credit steps.

    python -m benchmarks.wait_multiples [--multiples 4,5,6,7,8,9,10] [--densities 0.003] \\
        [--steps 8] [--workers 2] [--json docs/results/wait_multiples.json]

The product's bound is ``MULTIPLE`` x the mean time to first token of the last requests served
(``mechanism.wait_bound``), and a request that has waited it ranks as if it bid
``DEFAULT_DENSITY`` $/s per prompt token more, reached in ``DEFAULT_STEPS`` steps
(``mechanism.aging``). For each candidate setting this runs the KV sweep (``python -m benchmarks
--sweep``, the product's default policy beside the goal's baselines) with the automatic bound at
that multiple, density and steps, one process per (KV capacity, groups) part, ``--workers`` at a
time, and keeps the default policy's goal figures at each point: capture, hit gap, mean TTFT
against the best bid-blind policy, p99 TTFT against lpm's. The docs block ``wait-multiples``
(``benchmarks.docs``) shows, per setting, the points where the goal was met.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from mechanism import DEFAULT_POLICY
from mechanism.aging import DEFAULT_DENSITY, DEFAULT_STEPS
from mechanism.wait_bound import MULTIPLE

from .goal import NEEDED, Goal
from .html import arguments, write_json
from .options import floats, ints
from .report import from_json
from .sweep import DEFAULT_GROUPS, DEFAULT_KV_CAPACITIES

# Each part's own main point is made as small as it can be: only its sweep is read.
PART = ("--sweep", "--gsp-num-groups", "8", "--gsp-prompts-per-group", "4", "--load", "0.5")
POLICIES = ",".join((*NEEDED, DEFAULT_POLICY))


def part_argv(multiple: float, density: float, steps: int, kv: int, groups: int) -> list[str]:
    """The sweep command's arguments for one (KV capacity, groups) part at ``multiple``,
    ``density`` and ``steps``."""
    return [
        *PART,
        "--sweep-kv", str(kv),
        "--sweep-groups", str(groups),
        "--policies", POLICIES,
        "--wait-multiple", f"{multiple:g}",
        "--set", f"wait_density={density:g}",
        "--set", f"wait_steps={steps}",
    ]  # fmt: skip


def part_rows(doc: dict, multiple: float, density: float, steps: int) -> list[dict]:
    """A part's ``--json`` as rows: each point's place and the default policy's goal figures,
    worked out again from the point's metrics (``report.from_json``)."""
    rows = []
    for point in doc["sweep"]["grid"]:
        goal = from_json(point["policies"])[1][DEFAULT_POLICY]
        rows.append(
            {
                "multiple": multiple,
                "density": density,
                "steps": steps,
                "kv": point["kv_capacity_tokens"],
                "groups": point["groups"],
                "load": point["load"],
                "capture": goal.capture,
                "hit_gap_pp": goal.hit_gap_pp,
                "ttft_vs_best": goal.ttft_vs_best,
                "tail_vs_lpm": goal.tail_vs_lpm,
            }
        )
    return rows


def setting_order(row: dict) -> tuple:
    """Rows by setting (steps, density, multiple), then by point."""
    return (row["steps"], row["density"], row["multiple"], -row["kv"], row["groups"], row["load"])


def goal_of(row: dict) -> Goal:
    """A row's goal figures (JSON's null capture is the NaN it was: the check does not apply)."""
    capture = row["capture"]
    return Goal(
        float("nan") if capture is None else capture,
        row["hit_gap_pp"],
        row["ttft_vs_best"],
        row["tail_vs_lpm"],
    )


def _run_part(multiple: float, density: float, steps: int, kv: int, groups: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "part.json"
        argv = [
            *part_argv(multiple, density, steps, kv, groups), "--json", str(out), "--no-progress"
        ]  # fmt: skip
        subprocess.run(
            [sys.executable, "-m", "benchmarks", *argv], check=True, stdout=subprocess.DEVNULL
        )
        return part_rows(json.loads(out.read_text(encoding="utf-8")), multiple, density, steps)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.wait_multiples", description=__doc__)
    p.add_argument("--multiples", type=floats, default=(4, 5, 6, 7, 8, 9, 10))
    p.add_argument("--densities", type=floats, default=(DEFAULT_DENSITY,), help="$/s per token")
    p.add_argument("--steps", type=ints, default=(DEFAULT_STEPS,), help="credit steps")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", metavar="OUT", help="write the rows as JSON")
    args = p.parse_args(argv)
    settings = [(m, d, k) for k in args.steps for d in args.densities for m in args.multiples]
    parts = [(m, d, k, kv, g) for m, d, k in settings for kv in DEFAULT_KV_CAPACITIES
             for g in DEFAULT_GROUPS]  # fmt: skip
    rows: list[dict] = []
    with ThreadPoolExecutor(max(1, args.workers)) as pool:
        futures = {pool.submit(_run_part, *part): part for part in parts}
        for done, future in enumerate(as_completed(futures), 1):
            m, d, k, kv, g = futures[future]
            part = future.result()
            rows += part
            met = sum(goal_of(r).met for r in part)
            print(
                f"[{done}/{len(parts)}] multiple {m:g}, density {d:g}, {k} steps, KV "
                f"{kv // 1000}k, {g} groups: goal met at {met} of {len(part)} loads",
                flush=True,
            )
    rows.sort(key=setting_order)
    for m, d, k in settings:
        at = [r for r in rows if (r["multiple"], r["density"], r["steps"]) == (m, d, k)]
        met = sum(goal_of(r).met for r in at)
        print(f"multiple {m:g}, density {d:g}, {k} steps: goal met at {met} of {len(at)} points")
    if args.json:
        meta = {"argv": arguments(argv), "policy": DEFAULT_POLICY,
                "in_force": [MULTIPLE, DEFAULT_DENSITY, DEFAULT_STEPS]}  # fmt: skip
        write_json(args.json, {"meta": meta, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
