"""Bid distributions for generated workloads: every request gets a bid ($/s) and a bid class.

The bid class is the label the report groups latency by ("latency by bid class"):

- ``two-class``: 20% ``urgent`` requests bidding lognormal(mu=1, sigma=1) dollars per second of
  waiting (median ~$2.7/s), 80% ``background`` bidding lognormal(mu=-2, sigma=1) (median ~$0.14/s);
- ``constant``: everyone bids ``value``; one class, ``all``;
- ``uniform``: uniform on [low, high]; ``high`` above the 80th percentile, else ``low``;
- ``lognormal``: lognormal(mu, sigma); ``high`` above the 80th percentile, else ``low``.

The 80th-percentile split gives the one-distribution cases the same 20/80 shape as two-class.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from mechanism import MAX_BID

BID_DISTRIBUTIONS = ("two-class", "constant", "uniform", "lognormal")
URGENT_SHARE = 0.2  # two-class: the share of urgent requests
URGENT_MU, URGENT_SIGMA = 1.0, 1.0
BACKGROUND_MU, BACKGROUND_SIGMA = -2.0, 1.0
HIGH_QUANTILE = 0.8
_Z80 = 0.8416212335729143  # standard normal quantile at 0.8


@dataclass(frozen=True)
class BidSpec:
    """A named bid distribution and its parameters (dollars per second)."""

    name: str = "two-class"
    value: float = 0.1  # constant
    low: float = 0.0  # uniform
    high: float = 1.0  # uniform
    mu: float = -1.0  # lognormal, of log($/s)
    sigma: float = 1.0  # lognormal

    def __post_init__(self) -> None:
        if self.name not in BID_DISTRIBUTIONS:
            raise ValueError(
                f"unknown bid distribution {self.name!r}; choose one of "
                f"{', '.join(BID_DISTRIBUTIONS)}"
            )
        if self.name == "constant" and not 0 <= self.value <= MAX_BID:
            raise ValueError(f"constant bid must be in [0, {MAX_BID:g}], got {self.value}")
        if self.name == "uniform" and not 0 <= self.low <= self.high <= MAX_BID:
            raise ValueError(f"uniform bids need 0 <= low <= high, got [{self.low}, {self.high}]")
        if self.name == "lognormal" and not self.sigma >= 0:
            raise ValueError(f"lognormal sigma must be >= 0, got {self.sigma}")

    def draw(self, rng: random.Random) -> tuple[float, str]:
        """One bid in dollars per second, and its class."""
        if self.name == "two-class":
            if rng.random() < URGENT_SHARE:
                return _capped(rng.lognormvariate(URGENT_MU, URGENT_SIGMA)), "urgent"
            return _capped(rng.lognormvariate(BACKGROUND_MU, BACKGROUND_SIGMA)), "background"
        if self.name == "constant":
            return self.value, "all"
        if self.name == "uniform":
            bid = rng.uniform(self.low, self.high)
            cut = self.low + HIGH_QUANTILE * (self.high - self.low)
        else:
            bid = _capped(rng.lognormvariate(self.mu, self.sigma))
            cut = math.exp(self.mu + _Z80 * self.sigma)
        return bid, ("high" if bid > cut else "low")


def _capped(bid: float) -> float:
    return min(bid, MAX_BID)


def classes_by_quantile(bids: list[float]) -> list[str]:
    """``high`` for bids above the 80th percentile of ``bids``, else ``low`` (traces)."""
    if not bids:
        return []
    ordered = sorted(bids)
    cut = ordered[min(len(ordered) - 1, int(HIGH_QUANTILE * len(ordered)))]
    return ["high" if b >= cut and b > ordered[0] else "low" for b in bids]
