"""What a run measured, per policy: latency, cache, throughput, welfare and revenue.

Units: seconds, dollars, tokens. ``welfare`` is the realized welfare
(``mechanism.welfare.realized_welfare``; docs/mechanism.md, "Welfare"), -sum(bid x TTFT): the
dollars of waiting the requests' owners lost, so it is negative and closer to 0 is better.
Percentiles interpolate linearly between the closest ranks (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

from mechanism.welfare import realized_welfare


@dataclass(frozen=True)
class Served:
    """One finished request: its bid ($/s), class, latencies (s) and priority charge ($)."""

    id: str
    bid: float
    bid_class: str
    arrival: float
    ttft_s: float
    e2e_s: float
    charge: float


@dataclass(frozen=True)
class PolicyMetrics:
    """The row of one policy in the table and in ``--json``."""

    mean_ttft_s: float
    p50_ttft_s: float
    p99_ttft_s: float
    mean_e2e_s: float
    cache_hit_rate: float
    throughput_tokens_per_s: float
    welfare: float  # realized welfare, dollars (mechanism.welfare.realized_welfare)
    revenue: float
    # Prompt tokens computed again after their prefix was evicted (Engine's count; 0 where
    # the run does not count them)
    recomputed_prefix_tokens: int = 0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


# The keys of one policy's entry in ``--json``, in order.
METRIC_KEYS = tuple(f.name for f in fields(PolicyMetrics))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linear between closest ranks."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(
    served: Sequence[Served],
    *,
    makespan_s: float,
    tokens: int,
    cache_hit_rate: float,
    recomputed_prefix_tokens: int = 0,
) -> PolicyMetrics:
    """Metrics of one run: ``tokens`` = prompt + generated tokens served in ``makespan_s``."""
    ttfts = [s.ttft_s for s in served]
    return PolicyMetrics(
        mean_ttft_s=mean(ttfts),
        p50_ttft_s=percentile(ttfts, 50),
        p99_ttft_s=percentile(ttfts, 99),
        mean_e2e_s=mean([s.e2e_s for s in served]),
        cache_hit_rate=cache_hit_rate,
        throughput_tokens_per_s=tokens / makespan_s if makespan_s > 0 else math.nan,
        welfare=realized_welfare((s.bid, s.ttft_s) for s in served),
        revenue=sum(s.charge for s in served),
        recomputed_prefix_tokens=recomputed_prefix_tokens,
    )


def ratio(value: float, base: float) -> float:
    """``value / base``; NaN when the base is 0 (a bid-blind policy's revenue, say)."""
    if base == 0 or math.isnan(base) or math.isnan(value):
        return math.nan
    return value / base


def by_class(served: Sequence[Served]) -> dict[str, dict[str, float]]:
    """Per bid class: request count, mean and p99 TTFT, mean end-to-end latency (seconds)."""
    groups: dict[str, list[Served]] = {}
    for s in served:
        groups.setdefault(s.bid_class, []).append(s)
    return {
        cls: {
            "requests": len(rows),
            "mean_ttft_s": mean([s.ttft_s for s in rows]),
            "p99_ttft_s": percentile([s.ttft_s for s in rows], 99),
            "mean_e2e_s": mean([s.e2e_s for s in rows]),
        }
        for cls, rows in sorted(groups.items())
    }
