"""The market's goal for a priority policy, checked on one benchmark point.

A bid-using policy should buy priority without breaking the cache's physics. On the same
arrivals, against the bid-blind cache-aware policies (lpm, dfs-weight) and against highest-bid,
the unconstrained priority order:

- ``hit``: its cache hit rate is at least lpm's minus ``HIT_SLACK_PP`` percentage points;
- ``ttft``: its mean TTFT is at most ``TTFT_SLACK`` x the better mean TTFT of lpm and dfs-weight;
- ``capture``: it captures at least ``CAPTURE_MIN`` of highest-bid's welfare gain over lpm,
  capture = (welfare - welfare(lpm)) / (welfare(highest-bid) - welfare(lpm));
- ``tail``: its 99th-percentile TTFT is at most ``TAIL_SLACK`` x lpm's: priority may not buy
  the mean at the price of starving the requests that bid least (issue 35's bounded waiting).

Under KV pressure the first three are the check that the cache is kept (``Goal.cache_kept``):
priority bought without losing hits or mean TTFT to prefixes evicted and computed again.

Welfare is realized welfare, -sum(bid x TTFT) (metrics.py). Where highest-bid gains less than
``NO_GAIN`` of lpm's welfare loss (no queue to speak of: priority buys nothing), capture is NaN
and its check does not apply (``None``): the ratio of two near-zero gains says nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from mechanism import BID_POLICIES

from .metrics import PolicyMetrics
from .runner import Point

BASE = "lpm"
BID_BLIND_CACHE_AWARE = ("lpm", "dfs-weight")
UNCONSTRAINED = "highest-bid"
NEEDED = (*BID_BLIND_CACHE_AWARE, UNCONSTRAINED)
HIT_SLACK_PP = 1.0
TTFT_SLACK = 1.05
CAPTURE_MIN = 0.8
TAIL_SLACK = 1.25
NO_GAIN = 0.01


@dataclass(frozen=True)
class Goal:
    """One policy's figures against the goal, and whether each check passes."""

    capture: float
    hit_gap_pp: float  # cache hit rate - lpm's, percentage points
    ttft_vs_best: float  # mean TTFT / the better of lpm's and dfs-weight's
    tail_vs_lpm: float  # p99 TTFT / lpm's

    @property
    def passes(self) -> tuple[bool, bool, bool | None, bool]:
        """(hit, ttft, capture, tail); capture None where it does not apply (NaN)."""
        return (
            self.hit_gap_pp >= -HIT_SLACK_PP,
            self.ttft_vs_best <= TTFT_SLACK,
            None if math.isnan(self.capture) else self.capture >= CAPTURE_MIN,
            self.tail_vs_lpm <= TAIL_SLACK,
        )

    @property
    def met(self) -> bool:
        """Every check that applies passes."""
        return all(ok is not False for ok in self.passes)

    @property
    def cache_checks(self) -> tuple[bool, bool, bool | None]:
        """The checks but the tail: (hit, ttft, capture), as in ``passes``."""
        hit, ttft, capture, _ = self.passes
        return hit, ttft, capture

    @property
    def cache_kept(self) -> bool:
        """Every check of ``cache_checks`` that applies passes."""
        return all(ok is not False for ok in self.cache_checks)

    def as_dict(self) -> dict[str, object]:
        hit, ttft, capture, tail = self.passes
        return {
            "capture": self.capture,
            "hit_gap_pp": self.hit_gap_pp,
            "ttft_vs_best": self.ttft_vs_best,
            "tail_vs_lpm": self.tail_vs_lpm,
            "hit_ok": hit,
            "ttft_ok": ttft,
            "capture_ok": capture,
            "tail_ok": tail,
        }


def capture(welfare: float, base: float, unconstrained: float) -> float:
    """The share of ``unconstrained``'s welfare gain over ``base`` that ``welfare`` achieves;
    NaN where that gain is under ``NO_GAIN`` of ``base``'s loss (welfare is negative)."""
    gain = unconstrained - base
    if not gain > NO_GAIN * abs(base):  # NaN too
        return math.nan
    return (welfare - base) / gain


def goals(metrics: Mapping[str, PolicyMetrics], policies: list[str]) -> dict[str, Goal]:
    """The goal's figures of each of ``policies``; empty if lpm, dfs-weight or highest-bid did
    not run (nothing to compare with)."""
    if any(p not in metrics for p in NEEDED):
        return {}
    base = metrics[BASE]
    best_ttft = min(metrics[p].mean_ttft_s for p in BID_BLIND_CACHE_AWARE)
    top = metrics[UNCONSTRAINED].welfare
    out = {}
    for p in policies:
        m = metrics[p]
        out[p] = Goal(
            capture=capture(m.welfare, base.welfare, top),
            hit_gap_pp=(m.cache_hit_rate - base.cache_hit_rate) * 100,
            ttft_vs_best=m.mean_ttft_s / best_ttft,
            tail_vs_lpm=m.p99_ttft_s / base.p99_ttft_s,
        )
    return out


def point_goals(point: Point) -> dict[str, Goal]:
    """The goal's figures of a benchmark point's bid-using policies (but highest-bid); empty
    without the policies it compares with."""
    metrics = {name: run.metrics for name, run in point.runs.items()}
    return goals(metrics, checked_policies(list(metrics)))


def checked_policies(names: list[str]) -> list[str]:
    """The policies of a run the goal is for: the bid-using ones except highest-bid itself."""
    return [p for p in names if p in BID_POLICIES and p != UNCONSTRAINED]
