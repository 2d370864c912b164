"""Budget pacing for the autobidder (docs/mechanism.md, "Pacing"): dual mirror descent on
log(1 + mu).

A tenant gives a budget per period (dollars) and a value per request class (dollars per second of
waiting it would really pay). The agent bids ``value / (1 + mu)``: ``mu = 0`` bids the full value,
a larger ``mu`` shades every bid alike. After each update interval it takes one step on the dual of
the budget constraint in ``l = log(1 + mu)``,

    l <- clip(l + eta * clip(spent / target - 1, -1, gradient_clip), 0, log(1 + mu_max)),
    eta = eta0 / sqrt(T),

where ``spent`` is what the interval cost, ``target`` what it should have cost to use the budget
left evenly over the time left (remaining budget x interval / time left), and ``T`` the number of
updates in a period. A step in ``l`` moves ``1 + mu`` by a factor, so one step rule serves a
multiplier near 0 and one near 100 alike, and a burst of ``k`` times the target raises it by at most
``exp(eta * min(k - 1, gradient_clip))`` (the clip is high: a burst is real spend, and clipping it
at +1 made the rule overspend in bursts and shade too little afterwards). In the last
``end_guard_share`` of the period the rise is limited to ``eta`` a step: the target there is a small
remainder over a short time, and one noisy interval would otherwise stop the bidding for good.

**The path term, tried and not taken** (issue 50; ``PATH_TERM``, off by default: ``path_gain``
0). With ``path_gain`` K > 0, ``l = d + K x ahead``, where ``d`` is the dual step above and
``ahead`` how far the spend so far is ahead of the even path (budget x time gone / period), as a
share of the budget, 0 when behind; ``d`` is read back from ``mu`` each step as
``l - K x ahead`` (so the state stays ``mu``, as live). The pacing benchmark's diagnosis of the
dual step's unspent budget (``benchmarks.pacing``, its report) is that the multiplier overshoots
after bursts (one charge can cost 20x an interval's target), not that it sits at ``mu_max`` or that
the exposure reserve bids 0. The path term answers a burst once, in proportion to how far ahead
it puts the tenant, with the dual step counting it as +1 only. It spends more of the budget, but
the clipped dual step's level settles too low under lumpy spend (an interval is far more often
under its target than over it), so it spends early and buys less: its utility fell well below
the best fixed multiplier's (docs/mechanism.md has the figures). It is kept here, measured
beside the rule in force, for the next design to beat.

**The fall by mu, tried and not taken** (``FALL_BY_MU``, off by default: ``fall_gain`` 0). With
``fall_gain`` c > 0, a step down (an interval under its target) is ``1 + c / (1 + mu)^2`` times
as long: the multiplier comes back fast after a burst when the shading is light (the loose
budgets, where the diagnosis found the unspent money) and as the rule in force when it is heavy
(the tight ones, where a fast fall would spend early on cheap requests). It spends more of every
budget, but buys less: on the benchmark's held-out seeds its utility against the best fixed
multiplier fell in five rows of six (docs/mechanism.md has the figures).

``mu_max`` (:func:`mu_max_for`) is derived, not fixed: it is the multiplier at which the tenant
could not exceed its target rate even if every request were charged its full bid x wait bound.
A new period starts from the last one's multiplier (:meth:`PacingAgent.next_period`).

**Anchors and what carries over.** Balseiro & Gur (2019, "Learning in repeated auctions with
budgets: regret minimization and equilibrium") pace a budgeted bidder by bidding ``v / (1 + mu)``
with a subgradient step on ``mu`` of size ~ 1/sqrt(T), and show that in a stationary stochastic
environment it attains the best fixed multiplier's payoff up to O(sqrt(T)) and never runs out
early by more than that. Balseiro, Lu & Mirrokni ("The best of many worlds: dual mirror descent
for online allocation problems", 2020/2023) give the same guarantee for mirror descent on the dual
with any strongly convex reference function; the step in ``log(1 + mu)`` is that update with an
entropy-like reference, and they bound the dual by the largest reward over the target rate (our
``mu_max``). Their assumptions here:

- *Truthful per-request payments*: holds for the plan. A request's charge is the Myerson payment of
  a monotone allocation (docs/mechanism.md, "Payments"), so a request worth ``v`` to a tenant whose
  money is worth ``1 + mu`` maximizes ``v T(b) - (1 + mu) p(b)`` by bidding ``b = v / (1 + mu)``,
  where ``T`` is the *planned* time saved. The realized saving is smaller (requests admitted in one
  prefill batch start together, though the plan orders them), so in the benchmark shading pays a
  little even with no budget: the best fixed multiplier without one is 0.1-0.4, not 0.
- *Stationary (i.i.d.) requests and competitors*: holds in the benchmark's measured regime
  (``benchmarks.pacing``), not in a live burst; the adaptive target (what is left over the time
  left) is the usual remedy for drift.
- *Rounds independent of past bids*: only approximately. The queue carries state from round to
  round, and a tenant's own requests compete with each other: shading now changes whom its later
  requests wait behind. The benchmark measures what this costs against the best fixed multiplier.
- *Spend per step small against the target*: does not hold. A charge is at most bid x the
  request's wait bound (its ``priority_cap``), but one urgent request can cost 20x an interval's
  target, which is what makes the multiplier swing (the benchmark's figures and diagnosis).

**Safety is not the agent's** but the budget's, the same rule in the benchmark and live
(docs/mechanism.md, "The safety rule"): settlement writes a priority charge of an autobid request as
at most what is left of the autobidder's budget, serialized per tenant; the bidder keeps an exposure
reserve for its requests in flight (:class:`Exposure`) and bids 0 when what is left does not cover
it (:func:`safe_bid`), so that what the budget cannot collect when it runs out stays small.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from .requests import number_checked

DEFAULT_ETA0 = 1.0  # tuned on the benchmark's training seeds (benchmarks.pacing)
DEFAULT_PATH_GAIN = 0.0  # no path term: tried (PATH_TERM), it lost utility (the docstring)
DEFAULT_FALL_GAIN = 0.0  # no faster fall: tried (FALL_BY_MU), it lost utility (the docstring)
DEFAULT_GRADIENT_CLIP = 20.0  # overspend in one interval: up to 21x the target counts in full
DEFAULT_END_GUARD_SHARE = 0.1  # the last tenth of a period: mu rises by at most eta a step
DEFAULT_UPDATES = 400  # updates per period when the caller does not say
MU_MAX_FLOOR = 1.0  # the derived mu_max is never below this
# The rule in force: the dual step alone (the defaults above, spelled out for the benchmark).
DUAL_STEP_ONLY = {"path_gain": 0.0, "fall_gain": 0.0, "gradient_clip": 20.0, "end_guard_share": 0.1}
# The design tried for issue 50 and not taken (the benchmark's "pacing" candidate, with its
# path_gain tuned): a burst counted as twice the target only, no end guard, and the path term.
PATH_TERM = {"gradient_clip": 1.0, "end_guard_share": 0.0}
# The second design tried and not taken: the rule in force with a step down made longer the
# lighter the shading (``fall_gain``, tuned by the benchmark).
FALL_BY_MU = dict(DUAL_STEP_ONLY)

# The exposure reserve: the high quantile of charge / (bid x wait bound) over recent autobid
# requests, taken as what a request in flight will cost per dollar of its worst case.
EXPOSURE_QUANTILE = 0.99
EXPOSURE_WINDOW = 512  # recent settled requests the quantile is taken over
EXPOSURE_MIN_SAMPLES = 32  # until then, the worst case (factor 1)


def mu_max_for(
    *, value_max: float, arrival_rate: float, wait_bound_s: float, target_rate: float
) -> float:
    """The largest multiplier pacing can need, from the tenant's values and its target rate.

    At ``1 + mu = value_max x arrival_rate x wait_bound_s / target_rate`` every bid is at most
    ``target_rate / (arrival_rate x wait_bound_s)``, so even if every request (``arrival_rate``
    a second) were charged its full bid x wait bound, the spend rate would be at most
    ``target_rate`` (dollars a second). Never below ``MU_MAX_FLOOR``.
    """
    for name, value in (
        ("value_max", value_max),
        ("arrival_rate", arrival_rate),
        ("wait_bound_s", wait_bound_s),
        ("target_rate", target_rate),
    ):
        number_checked(name, value, allow_zero=True)
    if target_rate == 0:
        return math.inf if value_max > 0 else MU_MAX_FLOOR
    return max(MU_MAX_FLOOR, value_max * arrival_rate * wait_bound_s / target_rate - 1.0)


@dataclass
class PacingAgent:
    """One tenant's autobidder for one budget period. Dollars, seconds."""

    budget: float  # dollars for the period
    period_s: float  # length of the period, seconds
    values: Mapping[str, float]  # request class -> value, $/s of waiting
    updates: int = DEFAULT_UPDATES  # T: pacing updates in a period
    eta0: float = DEFAULT_ETA0
    mu_max: float = 100.0
    mu: float = 0.0  # the multiplier now (a warm start: the previous period's)
    path_gain: float = DEFAULT_PATH_GAIN
    fall_gain: float = DEFAULT_FALL_GAIN
    gradient_clip: float = DEFAULT_GRADIENT_CLIP
    end_guard_share: float = DEFAULT_END_GUARD_SHARE
    spent: float = 0.0  # dollars spent so far in the period
    elapsed_s: float = 0.0  # seconds of the period gone
    history: list[tuple[float, float, float]] = field(default_factory=list)  # (t, mu, spent)
    guard_held: float = 0.0  # the rise of log(1 + mu) the end guard held back, summed

    def __post_init__(self) -> None:
        number_checked("budget", self.budget, allow_zero=True)
        number_checked("period_s", self.period_s)
        number_checked("eta0", self.eta0)
        number_checked("gradient_clip", self.gradient_clip)
        number_checked("path_gain", self.path_gain, allow_zero=True)
        number_checked("fall_gain", self.fall_gain, allow_zero=True)
        if not 0 <= self.end_guard_share < 1:
            raise ValueError(f"end_guard_share must lie in [0, 1), got {self.end_guard_share!r}")
        if isinstance(self.updates, bool) or not isinstance(self.updates, int) or self.updates < 1:
            raise ValueError(f"updates must be a positive int, got {self.updates!r}")
        if not (isinstance(self.mu_max, int | float) and self.mu_max > 0):
            raise ValueError(f"mu_max must be > 0, got {self.mu_max!r}")
        if not 0 <= self.mu <= self.mu_max:
            raise ValueError(f"mu must lie in [0, mu_max], got {self.mu!r}")
        if not self.values:
            raise ValueError("the autobidder needs a value for at least one request class")
        for name, value in self.values.items():
            number_checked(f"value of class {name!r}", value, allow_zero=True)

    @property
    def eta(self) -> float:
        """The step in log(1 + mu): eta0 / sqrt(T)."""
        return self.eta0 / math.sqrt(self.updates)

    @property
    def remaining(self) -> float:
        """Budget left in the period, dollars (never negative)."""
        return max(0.0, self.budget - self.spent)

    def shaded(self, request_class: str) -> float:
        """The class's value shaded by the multiplier, $/s: the bid before the safety rule."""
        if request_class not in self.values:
            known = ", ".join(sorted(self.values))
            raise ValueError(f"no value for request class {request_class!r}; known: {known}")
        return self.values[request_class] / (1.0 + self.mu)

    def target(self, interval_s: float) -> float:
        """Dollars to spend in the next ``interval_s`` to spread the rest of the budget evenly."""
        left = self.period_s - self.elapsed_s
        if left <= 0:
            return 0.0
        return self.remaining * min(1.0, interval_s / left)

    def ahead(self) -> float:
        """How far the spend is ahead of the even path (the budget spread evenly over the
        period), as a share of the budget; 0 when it is on or behind it."""
        if self.budget <= 0:
            return 0.0
        even = self.budget * min(1.0, self.elapsed_s / self.period_s)
        return max(0.0, self.spent - even) / self.budget

    def observe(self, spent: float, interval_s: float) -> float:
        """Record an interval's spend (dollars over ``interval_s`` seconds); return the new mu."""
        number_checked("spent", spent, allow_zero=True)
        number_checked("interval_s", interval_s)
        target = self.target(interval_s)
        # The dual step's level: log(1 + mu) less the path term it carried.
        base = max(0.0, math.log1p(self.mu) - self.path_gain * self.ahead())
        self.spent += spent
        self.elapsed_s += interval_s
        if target > 0:
            gradient = spent / target - 1.0
        else:  # nothing left to spend, or the period is over: hold unless money still goes out
            gradient = self.gradient_clip if spent > 0 else 0.0
        rise = self.gradient_clip
        if self.elapsed_s > (1.0 - self.end_guard_share) * self.period_s:
            rise = min(rise, 1.0)
            self.guard_held += self.eta * max(0.0, min(self.gradient_clip, gradient) - rise)
        gradient = max(-1.0, min(rise, gradient))
        if gradient < 0:  # the fall by mu (0: off)
            gradient *= 1.0 + self.fall_gain / (1.0 + self.mu) ** 2
        top = math.log1p(self.mu_max)
        base = min(top, max(0.0, base + self.eta * gradient))
        level = min(top, base + self.path_gain * self.ahead())
        self.mu = min(self.mu_max, math.expm1(level))
        self.history.append((self.elapsed_s, self.mu, self.spent))
        return self.mu

    def next_period(self, *, budget: float | None = None) -> PacingAgent:
        """The agent for the next period: the same settings, warm-started at this mu."""
        budget = self.budget if budget is None else budget
        return replace(self, budget=budget, spent=0.0, elapsed_s=0.0, history=[])


def exposure_factor(
    ratios: Iterable[float],
    *,
    quantile: float = EXPOSURE_QUANTILE,
    min_samples: int = EXPOSURE_MIN_SAMPLES,
) -> float:
    """What a request in flight is expected to cost per dollar of its worst case, at most.

    ``ratios``: charge / (bid x wait bound) of recently settled autobid requests (the uncapped
    charge: what the engine asked). The ``quantile`` of them, in [0, 1]; 1 (the worst case) until
    ``min_samples`` are known.
    """
    values = [min(1.0, max(0.0, r)) for r in ratios]
    if len(values) < min_samples:
        return 1.0
    return high_quantile(values, quantile)


def high_quantile(values: Iterable[float], quantile: float) -> float:
    """The ``quantile`` (in [0, 1]) of ``values`` by the nearest rank: the smallest value with
    at least that share of them at or below it. ``values`` must not be empty."""
    ordered = sorted(values)
    rank = min(len(ordered) - 1, math.ceil(quantile * len(ordered)) - 1)
    return ordered[max(0, rank)]


@dataclass
class Exposure:
    """The running exposure factor of one bidder: the ``quantile`` of its last ``window``
    charge / worst-case ratios (:func:`exposure_factor`)."""

    window: int = EXPOSURE_WINDOW
    quantile: float = EXPOSURE_QUANTILE
    min_samples: int = EXPOSURE_MIN_SAMPLES
    ratios: deque[float] = field(default_factory=deque)
    factor: float = 1.0

    def observe(self, *, charge: float, worst_case: float) -> None:
        """A settled request: what the engine charged it, and its bid x wait bound."""
        if worst_case > 0:
            self.ratios.append(charge / worst_case)
            while len(self.ratios) > self.window:
                self.ratios.popleft()

    def update(self) -> float:
        """Recompute the factor (at each pacing step, as live); return it."""
        self.factor = exposure_factor(
            self.ratios, quantile=self.quantile, min_samples=self.min_samples
        )
        return self.factor


def safe_bid(
    *, shaded: float, remaining: float, in_flight: float, factor: float, wait_bound_s: float
) -> float:
    """The bid the safety rule allows, $/s (docs/mechanism.md, "The safety rule").

    ``shaded``: the pacer's bid; ``remaining``: what the budget has left (dollars, after the
    settled charges); ``in_flight``: the worst cases (bid x wait bound, dollars) of its requests
    whose priority charge has not settled yet; ``factor``: the exposure factor. The reserve for
    requests in flight is ``factor x in_flight``; a new request is given at most what is left
    beyond it, ``(remaining - reserve) / (factor x wait_bound_s)``, and 0 when nothing is.
    Works alike on floats (the benchmark) and Decimals (the gateway, exactly).
    """
    available = remaining - factor * in_flight
    if available <= 0 or shaded <= 0:
        return 0.0
    unit = factor * wait_bound_s
    return shaded if unit <= 0 else min(shaded, available / unit)
