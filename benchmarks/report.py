"""The benchmark's text output: the policy table of one run and the sweep's findings table."""

from __future__ import annotations

import math

from .goal import (
    CAPTURE_MIN,
    HIT_SLACK_PP,
    NO_GAIN,
    TTFT_SLACK,
    Goal,
    point_goals,
)
from .metrics import METRIC_KEYS, ratio
from .runner import Point
from .sweep import SweepPoint

BASE_POLICY = "lpm"

# Column title and number format of each metric.
_COLUMNS = {
    "mean_ttft_s": ("mean TTFT s", "{:.3f}"),
    "p50_ttft_s": ("p50 TTFT s", "{:.3f}"),
    "p99_ttft_s": ("p99 TTFT s", "{:.3f}"),
    "mean_e2e_s": ("mean e2e s", "{:.3f}"),
    "cache_hit_rate": ("cache hit", "{:.3f}"),
    "throughput_tokens_per_s": ("tokens/s", "{:.0f}"),
    "welfare": ("welfare $", "{:.2f}"),
    "revenue": ("revenue $", "{:.2f}"),
}


def _num(fmt: str, value: float) -> str:
    return "-" if math.isnan(value) else fmt.format(value)


def _ratio(value: float, base: float) -> str:
    r = ratio(value, base)
    return "  -  " if math.isnan(r) else f"x{r:.2f}"


def point_header(point: Point) -> str:
    """One line naming the workload and its arrival rate."""
    line = point.workload.title or point.workload.name
    if point.load is not None:
        line += (
            f"; load {point.load:g} x capacity {point.capacity_rps:.2f} req/s"
            f" = {point.rate_rps:.2f} req/s Poisson"
        )
    return line


def _checks(goal: Goal | None) -> str:
    """The goal's three checks as ``yes/no/yes`` (hit/TTFT/capture); "-" without a goal."""
    if goal is None:
        return "-"
    return "/".join("n/a" if ok is None else "yes" if ok else "no" for ok in goal.passes)


def policy_table(point: Point, base: str = BASE_POLICY) -> str:
    """One row per policy: every metric with its ratio to ``base`` (lpm), the goal's capture
    and checks for the bid-using policies (goal.py), and the wall time.

    Welfare is a loss (negative), so a welfare ratio below 1 means less waiting cost than lpm.
    Without ``base`` in the run, the ratios are to the first policy.
    """
    runs = point.runs
    if base not in runs:
        base = next(iter(runs))
    ref = runs[base].metrics.as_dict()
    met = point_goals(point)
    cells: list[list[str]] = []
    for run in runs.values():
        values = run.metrics.as_dict()
        row = [run.policy]
        for key in METRIC_KEYS:
            fmt = _COLUMNS[key][1]
            row.append(f"{_num(fmt, values[key])} {_ratio(values[key], ref[key])}")
        goal = met.get(run.policy)
        row.append("-" if goal is None else _num("{:.2f}", goal.capture))
        row.append(_checks(goal))
        row.append(f"{run.wall_s:.1f}")
        cells.append(row)
    titles = (
        ["policy"] + [_COLUMNS[k][0] for k in METRIC_KEYS] + ["capture", "hit/ttft/cap", "wall s"]
    )
    widths = [max(len(t), *(len(r[i]) for r in cells)) for i, t in enumerate(titles)]
    lines = [
        point_header(point),
        f"(each cell: value, then x ratio to {base}; wall s = real seconds of simulation;"
        f" {GOAL_LEGEND})",
        "  ".join(
            t.ljust(w) if i == 0 else t.rjust(w)
            for i, (t, w) in enumerate(zip(titles, widths, strict=True))
        ),
    ]
    for row in cells:
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return "\n".join(lines)


GOAL_LEGEND = (
    "capture = share of highest-bid's welfare gain over lpm; goal checks: hit >= lpm's "
    f"- {HIT_SLACK_PP:g} pp, mean TTFT <= {TTFT_SLACK:g} x the better of lpm and dfs-weight, "
    f"capture >= {CAPTURE_MIN:g} (n/a where highest-bid gains under {NO_GAIN:.0%} of lpm's "
    "welfare loss)"
)

_FINDING_COLUMNS = (
    ("kv k", "{:g}"),
    ("load", "{:g}"),
    ("groups", "{}"),
    ("x/group", "{}"),
    ("lpm TTFT s", "{:.3f}"),
    ("lpm hit", "{:.3f}"),
    ("hb/lpm TTFT", "{:.2f}"),
    ("dfs hit gap pp", "{:+.2f}"),
    ("dfs/best TTFT", "{:.3f}"),
    ("dfs welfare gain %", "{:+.1f}"),
    ("holds hit/ttft/welf", "{}"),
    ("dens/dfs TTFT", "{:.3f}"),
    ("dens welfare gain %", "{:+.1f}"),
    ("dens hit gap pp", "{:+.2f}"),
)


def findings_table(points: list[SweepPoint]) -> str:
    """One row per sweep point (sweep.py explains every column)."""
    rows = []
    for sp in points:
        f = sp.findings
        holds = "/".join("yes" if h else "no" for h in f.holds)
        values = (
            sp.kv_capacity_tokens / 1000,
            sp.point.load,
            sp.groups,
            sp.prompts_per_group,
            f.lpm_mean_ttft_s,
            f.lpm_cache_hit_rate,
            f.hb_ttft_vs_lpm,
            f.hit_gap_pp,
            f.ttft_vs_best,
            f.welfare_gain_vs_best_pct,
            holds,
            f.density_ttft_vs_dfs,
            f.density_welfare_gain_pct,
            f.density_hit_gap_pp,
        )
        rows.append(
            [
                v if isinstance(v, str) else _num(fmt, v)
                for (_, fmt), v in zip(_FINDING_COLUMNS, values, strict=True)
            ]
        )
    titles = [t for t, _ in _FINDING_COLUMNS]
    widths = [max(len(t), *(len(r[i]) for r in rows)) for i, t in enumerate(titles)]
    lines = [
        "findings: dfs = dfs-auction, dens = dfs-auction-density, hb = highest-bid; best = the "
        "better of lpm and dfs-weight per metric;",
        "hit gaps in percentage points, welfare gains in % of the other's welfare loss "
        "(positive: less waiting cost)",
        "  ".join(t.rjust(w) for t, w in zip(titles, widths, strict=True)),
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def goal_table(points: list[SweepPoint]) -> str:
    """One row per sweep point: for each bid-using policy, its capture, hit gap to lpm, TTFT
    against the best bid-blind policy and the three checks; then how many points each met."""
    policies = list(points[0].findings.goals) if points else []
    titles = ["kv k", "groups", "load"]
    for p in policies:
        titles += [f"{p} capture", "hit pp", "TTFT/best", "hit/ttft/cap"]
    rows = []
    for sp in points:
        row = [f"{sp.kv_capacity_tokens / 1000:g}", str(sp.groups), f"{sp.point.load:g}"]
        for p in policies:
            g = sp.findings.goals[p]
            row += [
                _num("{:.2f}", g.capture),
                _num("{:+.2f}", g.hit_gap_pp),
                _num("{:.3f}", g.ttft_vs_best),
                _checks(g),
            ]
        rows.append(row)
    widths = [max(len(t), *(len(r[i]) for r in rows)) for i, t in enumerate(titles)]
    lines = [
        f"goal: {GOAL_LEGEND}",
        "  ".join(t.rjust(w) for t, w in zip(titles, widths, strict=True)),
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    for p in policies:
        met = sum(1 for sp in points if sp.findings.goals[p].met)
        lines.append(f"{p}: goal met on {met} of {len(points)} points")
    return "\n".join(lines)
