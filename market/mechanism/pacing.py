"""Budget pacing for the autobidder (DESIGN.md 4.6): online gradient descent on a multiplier.

A tenant gives a budget per period (dollars) and a value per request class (dollars per second of
waiting it would really pay). The agent bids ``value / (1 + mu)``: ``mu = 0`` bids the full value,
a larger ``mu`` shades every bid alike. After each update interval it takes one projected
gradient step on the dual of the budget constraint,

    mu <- clip(mu + eta * clip(spent / target - 1, -1, 1), 0, mu_max),

where ``spent`` is what it spent in the interval and ``target`` what it should have spent to use
the remaining budget evenly over the remaining time (remaining budget x interval / time left).
Normalising by the target makes ``eta`` unitless, and clipping the gradient to [-1, 1] keeps
one burst (a queue forming, many urgent requests at once) from swinging the multiplier for
long: each step moves mu by at most eta. ``mu_max`` bounds the shading.

Safety: a request's priority charge is at most bid x planned wait (DESIGN.md 4.4), so the agent
never bids more than remaining budget / max_wait_s, where ``max_wait_s`` bounds the planned wait
(the caller's estimate, e.g. the queue's drain time). The gateway holds bid x max_wait_s before
admission, so concurrent requests cannot overspend either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_ETA = 0.5
DEFAULT_MU_MAX = 20.0


def _positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>=' if allow_zero else '>'} 0, got {value!r}")
    return float(value)


@dataclass
class PacingAgent:
    """One tenant's autobidder for one budget period. Dollars, seconds."""

    budget: float  # dollars for the period
    period_s: float  # length of the period, seconds
    values: Mapping[str, float]  # request class -> value, $/s of waiting
    eta: float = DEFAULT_ETA
    mu_max: float = DEFAULT_MU_MAX
    mu: float = 0.0
    spent: float = 0.0  # dollars spent so far in the period
    elapsed_s: float = 0.0  # seconds of the period gone
    history: list[tuple[float, float, float]] = field(default_factory=list)  # (t, mu, spent)

    def __post_init__(self) -> None:
        _positive("budget", self.budget, allow_zero=True)
        _positive("period_s", self.period_s)
        _positive("eta", self.eta)
        _positive("mu_max", self.mu_max)
        if not 0 <= self.mu <= self.mu_max:
            raise ValueError(f"mu must lie in [0, mu_max], got {self.mu!r}")
        if not self.values:
            raise ValueError("the autobidder needs a value for at least one request class")
        for name, value in self.values.items():
            _positive(f"value of class {name!r}", value, allow_zero=True)

    @property
    def remaining(self) -> float:
        """Budget left in the period, dollars (never negative)."""
        return max(0.0, self.budget - self.spent)

    def bid(self, request_class: str, *, max_wait_s: float) -> float:
        """The bid for a request of this class, $/s: shaded value, capped by the budget bound."""
        if request_class not in self.values:
            known = ", ".join(sorted(self.values))
            raise ValueError(f"no value for request class {request_class!r}; known: {known}")
        _positive("max_wait_s", max_wait_s)
        shaded = self.values[request_class] / (1.0 + self.mu)
        return min(shaded, self.remaining / max_wait_s)

    def target(self, interval_s: float) -> float:
        """Dollars to spend in the next ``interval_s`` to spread the rest of the budget evenly."""
        left = self.period_s - self.elapsed_s
        if left <= 0:
            return 0.0
        return self.remaining * min(1.0, interval_s / left)

    def observe(self, spent: float, interval_s: float) -> float:
        """Record an interval's spend (dollars over ``interval_s`` seconds); return the new mu."""
        _positive("spent", spent, allow_zero=True)
        _positive("interval_s", interval_s)
        target = self.target(interval_s)
        self.spent += spent
        self.elapsed_s += interval_s
        if target > 0:
            gradient = max(-1.0, min(1.0, spent / target - 1.0))
        else:
            gradient = 1.0 if spent > 0 or self.remaining <= 0 else 0.0
        self.mu = min(self.mu_max, max(0.0, self.mu + self.eta * gradient))
        self.history.append((self.elapsed_s, self.mu, self.spent))
        return self.mu


@dataclass
class NaiveAgent:
    """The baseline: bids its full value until the budget is gone, then stops bidding."""

    budget: float
    values: Mapping[str, float]
    spent: float = 0.0

    @property
    def remaining(self) -> float:
        return max(0.0, self.budget - self.spent)

    def bid(self, request_class: str, *, max_wait_s: float) -> float:
        """Full value while the budget bound allows it, else what the bound allows."""
        return min(self.values[request_class], self.remaining / max_wait_s)

    def observe(self, spent: float, interval_s: float) -> float:
        self.spent += spent
        return 0.0
