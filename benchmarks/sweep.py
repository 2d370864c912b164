"""The sweep that tests the paper's findings, and the market's goal, on the generated-shared-prefix
workload.

A grid of KV capacity x sharing (number of groups, the total number of requests held fixed, so
fewer groups means more requests per shared system prompt) x load (fraction of the capacity
measured at that point). The default KV capacities are the engine's (400k tokens) and a quarter
of it, 100k: with 2048-token system prompts, 64 groups' prompts (131k tokens) then no longer
fit, nor do 256 groups' (524k) at either size: those are the KV-pressure points. For every point
it compares, on the same arrivals:

- ``hb_ttft_vs_lpm``: mean TTFT of highest-bid / lpm (the paper: up to 12x at high load, as the
  cache hit rate collapses);
- against the best bid-blind cache-aware policy (lpm, dfs-weight), taking the best of the two
  for each metric separately (the strictest comparison): dfs-auction's cache hit rate gap in
  percentage points (the paper: within 1), its mean TTFT ratio (within 5%), and its welfare gain
  in percent of the best's welfare loss (positive: dfs-auction's owners lose less to waiting);
- dfs-auction-density against dfs-auction: mean TTFT ratio, welfare gain (%), hit rate gap (pp);
- every bid-using policy of the run but highest-bid against the market's goal (goal.py): capture
  of highest-bid's welfare gain, hit gap to lpm, TTFT against the best bid-blind policy, and the
  three checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from engines.contract.knobs import MarketKnobs
from engines.sim import EngineConfig

from .goal import BID_BLIND_CACHE_AWARE, Goal, point_goals
from .runner import Capacities, Point, run_point
from .workloads import Workload

# The goal's baselines, which every sweep runs (the paper's findings want dfs-auction and
# dfs-auction-density as well: findings).
GOAL_POLICIES = ("lpm", "dfs-weight", "highest-bid")
DEFAULT_LOADS = (0.5, 0.8, 0.95, 1.1, 1.5)
DEFAULT_GROUPS = (8, 64, 256)
DEFAULT_REQUESTS = 2048
DEFAULT_KV_CAPACITIES = (400_000, 100_000)


@dataclass(frozen=True)
class Findings:
    """The comparisons of one sweep point (see the module docstring)."""

    lpm_mean_ttft_s: float
    lpm_cache_hit_rate: float
    hb_ttft_vs_lpm: float
    hit_gap_pp: float
    ttft_vs_best: float
    welfare_gain_vs_best_pct: float
    density_ttft_vs_dfs: float
    density_welfare_gain_pct: float
    density_hit_gap_pp: float
    goals: dict[str, Goal]  # the market's goal, per bid-using policy but highest-bid

    @property
    def holds(self) -> tuple[bool, bool, bool]:
        """dfs-auction's three claims: hit within 1 pp, TTFT within 5%, welfare above."""
        return (
            self.hit_gap_pp >= -1.0,
            self.ttft_vs_best <= 1.05,
            self.welfare_gain_vs_best_pct > 0,
        )

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {k: v for k, v in asdict(self).items() if k != "goals"}
        out["holds"] = list(self.holds)
        out["goals"] = {p: g.as_dict() for p, g in self.goals.items()}
        return out


def _gain_pct(welfare: float, base: float) -> float:
    """How much less welfare ``welfare`` loses than ``base``, in percent of ``base``'s loss."""
    if base == 0:
        return math.nan
    return (welfare - base) / abs(base) * 100


def findings(point: Point) -> Findings:
    """Compare the policies of ``point``; ValueError if one of GOAL_POLICIES did not run. The
    paper's comparisons need dfs-auction and dfs-auction-density too: without them they are NaN
    (printed "-"), and the goal's checks stand alone."""
    missing = [p for p in GOAL_POLICIES if p not in point.runs]
    if missing:
        raise ValueError(f"the sweep needs policies {', '.join(missing)} too")
    m = {name: run.metrics for name, run in point.runs.items()}
    blind = [m[p] for p in BID_BLIND_CACHE_AWARE]
    best_hit = max(x.cache_hit_rate for x in blind)
    best_ttft = min(x.mean_ttft_s for x in blind)
    best_welfare = max(x.welfare for x in blind)
    lpm = m["lpm"]
    hb_ttft = m["highest-bid"].mean_ttft_s / lpm.mean_ttft_s
    dfs, density = m.get("dfs-auction"), m.get("dfs-auction-density")
    if dfs is None or density is None:
        nan = math.nan
        return Findings(lpm.mean_ttft_s, lpm.cache_hit_rate, hb_ttft, nan, nan, nan, nan, nan,
                        nan, goals=point_goals(point))  # fmt: skip
    return Findings(
        lpm_mean_ttft_s=lpm.mean_ttft_s,
        lpm_cache_hit_rate=lpm.cache_hit_rate,
        hb_ttft_vs_lpm=hb_ttft,
        hit_gap_pp=(dfs.cache_hit_rate - best_hit) * 100,
        ttft_vs_best=dfs.mean_ttft_s / best_ttft,
        welfare_gain_vs_best_pct=_gain_pct(dfs.welfare, best_welfare),
        density_ttft_vs_dfs=density.mean_ttft_s / dfs.mean_ttft_s,
        density_welfare_gain_pct=_gain_pct(density.welfare, dfs.welfare),
        density_hit_gap_pp=(density.cache_hit_rate - dfs.cache_hit_rate) * 100,
        goals=point_goals(point),
    )


@dataclass
class SweepPoint:
    """One point of the grid and its findings."""

    groups: int
    prompts_per_group: int
    kv_capacity_tokens: int
    point: Point
    findings: Findings


def run_sweep(
    make_workload: Callable[[int, int], Workload],
    policies: list[str],
    config: EngineConfig,
    *,
    loads: tuple[float, ...] = DEFAULT_LOADS,
    groups: tuple[int, ...] = DEFAULT_GROUPS,
    requests: int = DEFAULT_REQUESTS,
    kv_capacities: tuple[int, ...] = DEFAULT_KV_CAPACITIES,
    knobs: MarketKnobs | None = None,
    seed: int = 0,
    capacities: Capacities | None = None,
    on_served: Callable[[], None] | None = None,
    on_policy: Callable[[str], None] | None = None,
    wait_multiple: float | None = None,
) -> list[SweepPoint]:
    """Every (KV capacity, groups, load) point; ``make_workload(groups, prompts_per_group)``
    builds the gsp workload with ``requests`` in all (rounded to a multiple of the groups);
    ``wait_multiple``: under the market's automatic wait bound at that multiple
    (``runner.simulate``)."""
    capacities = capacities or Capacities()
    out = []
    for kv in kv_capacities:
        at_kv = replace(config, kv_capacity_tokens=kv)
        for g in groups:
            per_group = max(1, round(requests / g))
            workload = make_workload(g, per_group)
            for load in loads:

                def label(policy: str, g: int = g, load: float = load, kv: int = kv) -> None:
                    if on_policy is not None:
                        on_policy(f"kv {kv // 1000}k groups {g} load {load:g} {policy}")

                point = run_point(
                    workload,
                    policies,
                    at_kv,
                    knobs=knobs,
                    load=load,
                    seed=seed,
                    capacities=capacities,
                    on_served=on_served,
                    on_policy=label,
                    wait_multiple=wait_multiple,
                )
                out.append(SweepPoint(g, per_group, kv, point, findings(point)))
    return out


def sweep_requests(groups: tuple[int, ...], requests: int) -> int:
    """How many requests the sweep serves per policy, over all its points of one load and KV
    capacity."""
    return sum(max(1, round(requests / g)) * g for g in groups)
