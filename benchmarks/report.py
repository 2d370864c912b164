"""The benchmark's text output: the policy table of one run and the sweep's findings table."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from operator import attrgetter

from .goal import (
    BASE,
    CAPTURE_MIN,
    HIT_SLACK_PP,
    NO_GAIN,
    TAIL_SLACK,
    TTFT_SLACK,
    Goal,
    checked_policies,
    goals,
    point_goals,
)
from .html import Table
from .metrics import METRIC_KEYS, PolicyMetrics, ratio
from .runner import Point
from .sweep import SweepPoint

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
# The metrics the policy table shows (the JSON has them all; the tokens computed again after an
# eviction are there and in the KV notes' figures, not in the table).
TABLE_KEYS = tuple(k for k in METRIC_KEYS if k in _COLUMNS)


def formatted(fmt: str, value: float) -> str:
    return "-" if math.isnan(value) else fmt.format(value)


def _ratio(value: float, base: float) -> str:
    r = ratio(value, base)
    return "  -  " if math.isnan(r) else f"x{r:.2f}"


def point_header(point: Point) -> str:
    """One line naming the workload and its arrival rate."""
    workload = point.workload.title or point.workload.name
    return workload + load_text(point.load, point.capacity_rps, point.rate_rps)


def load_text(load: float | None, capacity_rps: float | None, rate_rps: float | None) -> str:
    """``; load L x capacity C req/s = R req/s Poisson``; nothing for a trace (no load)."""
    if load is None:
        return ""
    return f"; load {load:g} x capacity {capacity_rps:.2f} req/s = {rate_rps:.2f} req/s Poisson"


def goal_checks(goal: Goal | None) -> str:
    """The goal's four checks as ``yes/no/yes/no`` (hit/TTFT/capture/p99); "-" without a
    goal."""
    return "-" if goal is None else yes_no(goal.passes)


def yes_no(checks: Iterable[bool | None]) -> str:
    """Checks as ``yes/no/n/a`` (None: the check does not apply)."""
    return "/".join("n/a" if ok is None else "yes" if ok else "no" for ok in checks)


def policy_rows(
    metrics: Mapping[str, Mapping[str, float]], goals: Mapping[str, Goal]
) -> tuple[str, list[str], list[list[str]]]:
    """The policy table's column titles and one row per policy: every metric with its ratio to
    the base (lpm; the first policy when lpm did not run), and the goal's capture and checks for
    the bid-using policies (goal.py). Returns the base used, the titles and the rows.

    Welfare is a loss (negative), so a welfare ratio below 1 means less waiting cost than lpm.
    """
    base = BASE if BASE in metrics else next(iter(metrics))
    titles = ["policy"] + [_COLUMNS[k][0] for k in TABLE_KEYS] + ["capture", "hit/ttft/cap/p99"]
    rows = []
    for name, values in metrics.items():
        row = [name]
        for key in TABLE_KEYS:
            ratio = _ratio(values[key], metrics[base][key])
            row.append(f"{formatted(_COLUMNS[key][1], values[key])} {ratio}")
        goal = goals.get(name)
        row += ["-" if goal is None else formatted("{:.2f}", goal.capture), goal_checks(goal)]
        rows.append(row)
    return base, titles, rows


def from_json(
    policies: Mapping[str, Mapping[str, float | None]],
) -> tuple[dict[str, dict[str, float]], dict[str, Goal]]:
    """``--json``'s metrics per policy (JSON's null is the NaN it was), and the goal's figures
    worked out again from them: what :func:`policy_rows` takes."""
    metrics = {
        name: PolicyMetrics(**{k: math.nan if v is None else v for k, v in row.items()})
        for name, row in policies.items()
    }
    met = goals(metrics, checked_policies(list(metrics)))
    return {name: m.as_dict() for name, m in metrics.items()}, met


def policy_table(point: Point) -> str:
    """:func:`policy_rows` of one point as aligned text, with the wall time of each policy."""
    metrics = {name: run.metrics.as_dict() for name, run in point.runs.items()}
    base, titles, cells = policy_rows(metrics, point_goals(point))
    titles.append("wall s")
    for row, run in zip(cells, point.runs.values(), strict=True):
        row.append(f"{run.wall_s:.1f}")
    return (
        f"{point_header(point)}\n(each cell: value, then x ratio to {base}; wall s = real seconds"
        f" of simulation; {GOAL_LEGEND})\n" + Table(titles, cells).text()
    )


GOAL_LEGEND = (
    "capture = share of highest-bid's welfare gain over lpm; goal checks: hit >= lpm's "
    f"- {HIT_SLACK_PP:g} pp, mean TTFT <= {TTFT_SLACK:g} x the better of lpm and dfs-weight, "
    f"capture >= {CAPTURE_MIN:g} (n/a where highest-bid gains under {NO_GAIN:.0%} of lpm's "
    f"welfare loss), p99 TTFT <= {TAIL_SLACK:g} x lpm's"
)


# Each column of the findings table: its title, number format and what it shows of a point.
_FINDING_COLUMNS = (
    ("kv k", "{:g}", lambda sp: sp.kv_capacity_tokens / 1000),
    ("load", "{:g}", attrgetter("point.load")),
    ("groups", "{}", attrgetter("groups")),
    ("x/group", "{}", attrgetter("prompts_per_group")),
    ("lpm TTFT s", "{:.3f}", attrgetter("findings.lpm_mean_ttft_s")),
    ("lpm hit", "{:.3f}", attrgetter("findings.lpm_cache_hit_rate")),
    ("hb/lpm TTFT", "{:.2f}", attrgetter("findings.hb_ttft_vs_lpm")),
    ("dfs hit gap pp", "{:+.2f}", attrgetter("findings.hit_gap_pp")),
    ("dfs/best TTFT", "{:.3f}", attrgetter("findings.ttft_vs_best")),
    ("dfs welfare gain %", "{:+.1f}", attrgetter("findings.welfare_gain_vs_best_pct")),
    ("holds hit/ttft/welf", "{}", lambda sp: yes_no(sp.findings.holds)),
    ("dens/dfs TTFT", "{:.3f}", attrgetter("findings.density_ttft_vs_dfs")),
    ("dens welfare gain %", "{:+.1f}", attrgetter("findings.density_welfare_gain_pct")),
    ("dens hit gap pp", "{:+.2f}", attrgetter("findings.density_hit_gap_pp")),
)


def findings_table(points: list[SweepPoint]) -> str:
    """One row per sweep point (sweep.py explains every column)."""
    rows = [
        [
            v if isinstance(v := get(sp), str) else formatted(fmt, v)
            for _, fmt, get in _FINDING_COLUMNS
        ]
        for sp in points
    ]
    return (
        "findings: dfs = dfs-auction, dens = dfs-auction-density, hb = highest-bid; best = the "
        "better of lpm and dfs-weight per metric;\nhit gaps in percentage points, welfare gains "
        "in % of the other's welfare loss (positive: less waiting cost)\n"
        + Table([t for t, _, _ in _FINDING_COLUMNS], rows).text()
    )


def goal_table(points: list[SweepPoint]) -> str:
    """One row per sweep point: for each bid-using policy, its capture, hit gap to lpm, TTFT
    against the best bid-blind policy, p99 TTFT against lpm's and the four checks; then how many
    points each met."""
    policies = list(points[0].findings.goals) if points else []
    titles = ["kv k", "groups", "load"]
    for p in policies:
        titles += [f"{p} capture", "hit pp", "TTFT/best", "p99/lpm", "hit/ttft/cap/p99"]
    rows = []
    for sp in points:
        row = [f"{sp.kv_capacity_tokens / 1000:g}", str(sp.groups), f"{sp.point.load:g}"]
        for p in policies:
            g = sp.findings.goals[p]
            row += [
                formatted("{:.2f}", g.capture),
                formatted("{:+.2f}", g.hit_gap_pp),
                formatted("{:.3f}", g.ttft_vs_best),
                formatted("{:.2f}", g.tail_vs_lpm),
                goal_checks(g),
            ]
        rows.append(row)
    lines = [f"goal: {GOAL_LEGEND}", Table(titles, rows).text()]
    for p in policies:
        met = sum(1 for sp in points if sp.findings.goals[p].met)
        lines.append(f"{p}: goal met on {met} of {len(points)} points")
    return "\n".join(lines)
