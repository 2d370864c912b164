"""Does the autobidder pace? ``python -m benchmarks.pacing`` (docs/mechanism.md, "The autobidder").

**The environment.** One simulated engine in virtual time, congested but stationary: Poisson
arrivals at ``--rate`` (default 67 requests a second, about 0.95 of what this engine serves of the
workload, so a queue forms and drains all the time: mean TTFT ~0.4 s, p90 ~0.7 s) of a
generated-shared-prefix workload (32 Zipf-popular system prompts of 1024 tokens, questions of 256,
32 output tokens). Every request belongs to a tenant and has a value, dollars per second of
waiting, drawn two-class (20% urgent, lognormal) and scaled per tenant. Background traffic bids
its values; so does every tenant but the focal one, whose bidder alone changes between runs, with
common random numbers (the same arrivals, prompts and values for every strategy of a seed).

**The period.** A warm-up of ``WARMUP_S`` seconds fills the queue and the cache first (with 10 s
the focal tenant's unconstrained spend still fell by quarter, 0.43 / 0.23 / 0.17 / 0.17 of it, as
the cache warmed; with 40 s no quarter stands out on average); the budget
period is the next ``--period`` seconds; arrivals go on for ``COOLDOWN_S`` more so that the focal
tenant's last requests wait in the same regime. Only the focal tenant's requests that arrive in
the period are its budgeted ones (outside it, it bids its values and nothing is counted). Its
budget is ``s`` x what its period's requests are charged when it bids its full values with no
budget, measured in the same environment (the same seed), for ``s`` in ``BUDGET_SHARES``; 1.5 is the
non-binding control. Pacing updates ``UPDATES`` times over the period and goes on, with nothing
left to target, until the last charge settles.

**The same safety rule for every strategy** (docs/mechanism.md, "The safety rule";
``mechanism.pacing``, as the gateway and settlement run it live): a bid is ``safe_bid`` of the
strategy's shaded value (the exposure reserve for the requests in flight), each priority charge is
settled as at most what is left of the budget and at most the request's consent cap (bid x its wait
bound). What the budget cut is reported as ``uncollected``.

**Strategies.** ``pacing-dual``, the autobidder as the gateway and settlement run it (the dual
step alone, ``mechanism.pacing``'s defaults), and ``pacing``, the candidate design of issue 50
(``--design``: ``path``, ``PATH_TERM``'s path term; ``fall``, ``FALL_BY_MU``'s fall by mu;
``throttle``, throttling: the dual step as in force, each request bidding its full value with
probability 1 / (1 + mu), else 0; a design's gain tuned with eta0 on the training seeds;
``pacing-cold`` the same from mu = 0); ``fixed mu`` for every mu of a log-spaced grid (``mu=0``:
the full value, within the budget), ``zero`` (bids 0) and ``free`` (the full value, no budget).
``target`` (below) paces as live. For the worst seeds of each binding row and both designs the
report shows where the unspent budget went (time at mu_max, requests the exposure reserve bid 0,
what the end guard held back, the spend and mu paths).
A strategy's utility over the period's requests is the waiting cost it saves over bidding 0,
less what it paid:

    U = sum(v x TTFT | zero) - sum(v x TTFT) - paid        (dollars)

**Honest comparison.** Hyperparameters (eta0, K) and the best fixed multiplier are chosen on the
training seeds; the figures are on held-out seeds: spend / budget per seed, its peak over every
settlement, utility / the best fixed multiplier's per seed with the lower end of its 95% t
interval, paired differences with their intervals, uncollected / budget, the share of utility
from the top 5 requests, and the spend per quarter of the period (stationarity).

**A latency target** (``--latency-target TTFT_S,P``, only this case, on the held-out seeds):
the focal tenant's requests are one class asking for a first token within TTFT_S seconds with
probability P. ``target`` is the autobidder as the gateway runs it: the class is worth the quote
for the target (``mechanism.quotes`` over the newest ``HISTORY_MAX`` served requests of every
tenant, read again every ``QUOTE_REFRESH_S``; the cap when nothing is quoted, never above it),
bid as quote / (1 + mu), paced from mu = 0 with the default eta0. Against it, in the same runs
and budgets: ``quote0``, the period's first quote held as a fixed bid (the cap until one is
read: at these targets the warm-up's history often quotes nothing), ``quote-median``, the
median of the quotes the ``target`` run of the same seed read, held as a fixed bid (a second
pass), and ``mu=0``, the tenant's own values; all within the budget by the same safety rule.
Reported: the share of the period's requests served within TTFT_S (and the paired difference
by seed), spend / budget, and the share of the quote's reads that found one.
The cap stands for the tenant's ``priority_bid_cap``: its warm-up values' 90th percentile.
"""

from __future__ import annotations

import argparse
import itertools
import math
import multiprocessing
import random
import statistics
import sys
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engines.contract.knobs import MarketKnobs
from engines.sim import Engine, EngineConfig, SimRequest
from engines.sim.driver import ArrivalQueue, run_virtual
from mechanism.pacing import (
    DEFAULT_ETA0,
    DUAL_STEP_ONLY,
    FALL_BY_MU,
    PATH_TERM,
    Exposure,
    PacingAgent,
    mu_max_for,
    safe_bid,
)
from mechanism.quotes import HISTORY_MAX, Waited, bid_groups, quote

from .html import Section, Table, command_line, write_json, write_page
from .metrics import percentile
from .options import floats
from .progress import Progress
from .workloads import BenchRequest, gsp

TENANTS = ("A", "B")  # the focal tenants, one at a time
BACKGROUND = "bg"
TRAFFIC = {"bg": 0.5, "A": 0.32, "B": 0.18}  # share of the requests
VALUE_SCALE = {"bg": 1.0, "A": 1.0, "B": 2.0}  # x the drawn two-class value
BUDGET_SHARES = (0.25, 0.5, 0.8, 1.5)  # x the focal tenant's free spend; 1.5: not binding
BINDING = (0.25, 0.5, 0.8)
# 0 and 23 multipliers log-spaced from 0.02 to 200.
MU_GRID = (0.0, *(0.02 * 10 ** (4 * k / 22) for k in range(23)))
ETA0_GRID = (0.5, 1.0, 2.0)
PATH_GAIN_GRID = (1.0, 2.0, 3.0)  # the path term's gains tuned over, with eta0
CANDIDATE_PATH_GAIN = 3.0  # the candidate's path gain when none is tuned


@dataclass(frozen=True)
class Design:
    """A pacing design tried against the rule in force: ``mechanism.pacing``'s settings for it,
    the one of them tuned on the training seeds (its gain), and the gains tuned over."""

    name: str  # as tables say it
    settings: dict[str, float]
    gain: str  # the PacingAgent field the tuned gain sets
    symbol: str  # the gain's letter in tables
    grid: tuple[float, ...]
    # Throttling: a request bids its full value with probability 1 / (1 + mu), else 0 (the
    # multiplier's dual step as the rule in force); otherwise every bid is value / (1 + mu).
    throttle: bool = False


# The candidates (``--design``): the path term and the fall by mu (``mechanism.pacing``'s
# docstring says what each does and why neither is taken), and throttling (docs/mechanism.md).
DESIGNS = {
    "path": Design("the path term", PATH_TERM, "path_gain", "K", PATH_GAIN_GRID),
    "fall": Design("the fall by mu", FALL_BY_MU, "fall_gain", "c", (2.0, 4.0)),
    "throttle": Design("throttling", DUAL_STEP_ONLY, "path_gain", "K", (0.0,), throttle=True),
}
TRAIN_SEEDS = (0, 1, 2, 3)
HELD_OUT_SEEDS = tuple(range(100, 116))
UPDATES = 400  # pacing updates in the period
WARMUP_S = 40.0
COOLDOWN_S = 10.0
POLICY = "dfs-auction-density"
# A request's wait bound (its consent cap is bid x bound): four times the planned time to prefill
# what waits when it arrives, and at least this many seconds.
MIN_WAIT_BOUND_S = 0.5
WAIT_BOUND_FACTOR = 4.0
MU_MAX_WAIT_BOUND_S = 1.0  # the wait bound mu_max is derived with (a long wait in this regime)
# The latency-target case (--latency-target): the quote is read again this often, as the gateway
# keeps one (openai_api.gateway.selectors.PRIORITY_QUOTE_TTL_S), virtual seconds.
QUOTE_REFRESH_S = 5.0
# "quote-median": a fixed bid, the median of the quotes the "target" run of the same seed and
# budget read (a second pass: the fixed quote one would have picked knowing the period).
TARGET_STRATEGIES = ("target", "quote0", "quote-median", "mu=0")
TARGET_CAP_PERCENTILE = 90.0

# The t quantile t_{0.975, df} for the 95% intervals (df = seeds - 1).
_T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
    10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
    18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042,
}  # fmt: skip


def t975(df: int) -> float:
    """Student's t quantile at 0.975 for ``df`` degrees of freedom (1.96 above 30)."""
    if df < 1:
        return math.nan
    return _T975[min(k for k in _T975 if k >= df)] if df <= 30 else 1.96


def interval(xs: Sequence[float]) -> tuple[float, float, float]:
    """Mean and 95% t interval of ``xs`` (all three NaN when there are none)."""
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = statistics.fmean(xs)
    if n < 2:
        return mean, math.nan, math.nan
    half = t975(n - 1) * statistics.stdev(xs) / math.sqrt(n)
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class Setup:
    """The environment of a run (the same for every strategy of a seed)."""

    rate: float = 67.0  # arrivals a second, all tenants
    period_s: float = 70.0
    updates: int = UPDATES
    # Tenant-level charges: a request does not pay for delaying its own tenant's requests.
    charge_scope: str = "tenant"


@dataclass(frozen=True)
class Spec:
    """One run: the focal tenant's strategy under a budget."""

    seed: int
    tenant: str
    strategy: str  # "pacing", "pacing-cold", "pacing-dual", "mu=<x>", "zero", "free"
    budget: float = math.inf
    share: float = math.inf  # the budget as a share of the free spend (inf: none)
    eta0: float = DEFAULT_ETA0
    design: str = "path"  # the candidate's design (DESIGNS); the dual step is the rule in force
    gain: float = CANDIDATE_PATH_GAIN  # the candidate's tuned gain (its design's)
    mu0: float = 0.0  # pacing's warm start
    # The class's latency target (TTFT seconds, probability), for "target" (the autobidder
    # bidding the quote, paced) and "quote0" (the period's first quote, then fixed).
    target: tuple[float, float] | None = None
    fixed_bid: float = 0.0  # "quote-median": the bid, $/s


@dataclass
class Outcome:
    """What the focal tenant's period requests got in one run (dollars, seconds)."""

    spec: Spec
    paid: float = 0.0  # settled priority charges
    uncollected: float = 0.0  # cut by the budget
    consent_cut: float = 0.0  # cut by the requests' consent caps
    peak: float = 0.0  # the largest spend seen at any settlement
    cost: float = 0.0  # sum of value x TTFT
    requests: int = 0
    settled: int = 0
    quarters: list[float] = field(default_factory=lambda: [0.0] * 4)  # spend by quarter
    per_request: dict[str, float] = field(default_factory=dict)  # id -> v x TTFT - paid
    # Per pacing update: (t, spend, mu, the exposure reserve, period requests the safety rule
    # bid 0 since the last update though the strategy bid more), dollars and seconds.
    curve: list[tuple[float, float, float, float, int]] = field(default_factory=list)
    forced_zero: int = 0  # period requests bid 0 by the exposure reserve, not by the strategy
    forced_zero_value: float = 0.0  # their values, $/s
    value: float = 0.0  # the values of all period requests, $/s
    at_mu_max: int = 0  # pacing updates of the period that ended at mu_max
    guard_held: float = 0.0  # the rise of log(1 + mu) the end guard held back, summed
    spec_updates: int = 0  # pacing updates in the period
    mu_end: float = 0.0
    mu_mean: float = 0.0  # time average of mu over the period's updates
    met: int = 0  # period requests served within the latency target's TTFT
    quotes: list[float] = field(default_factory=list)  # the quotes read, $/s (nan: none)


@lru_cache(maxsize=4)
def workload(seed: int, setup: Setup) -> tuple[BenchRequest, ...]:
    """The seed's requests by arrival, each with its tenant and, as its ``bid``, its value ($/s
    of waiting; what every bidder but the focal one bids)."""
    span = WARMUP_S + setup.period_s + COOLDOWN_S
    total = int(setup.rate * span)
    groups = 32
    base = gsp(
        num_groups=groups,
        prompts_per_group=math.ceil(total / groups),
        system_prompt_len=1024,
        question_len=256,
        output_len=32,
        popularity="zipf",
        seed=seed,
    ).at_rate(setup.rate, seed)
    rng = random.Random(f"{seed}:tenants")
    tenants = rng.choices(list(TRAFFIC), list(TRAFFIC.values()), k=total)
    return tuple(
        replace(r, tenant=t, bid=r.bid * VALUE_SCALE[t])
        for r, t in zip(base.requests[:total], tenants, strict=True)
    )


CANDIDATES = ("pacing", "pacing-cold")  # the candidate design's runs; the others pace as live


def _candidate(spec: Spec) -> dict[str, float]:
    """The pacing settings of the candidate design's run ``spec``, its gain set."""
    design = DESIGNS[spec.design]
    return {**design.settings, design.gain: spec.gain}


class _Focal:
    """The focal tenant's bidder and its books for one run: the safety rule as live."""

    def __init__(
        self, spec: Spec, setup: Setup, rate: float, value_max: float, cap: float = math.inf
    ) -> None:
        self.spec = spec
        self.budget = spec.budget
        self.out = Outcome(spec)
        self.exposure = Exposure()
        # id -> worst case (bid x bound), its consent cap, until its charge settles; and their sum
        self.in_flight: dict[str, float] = {}
        self.in_flight_total = 0.0
        self.interval_spent = 0.0
        self.interval_forced = 0  # requests the safety rule bid 0 since the last update
        self.agent: PacingAgent | None = None
        self.mu = 0.0
        self.throttled = spec.strategy in CANDIDATES and DESIGNS[spec.design].throttle
        # A latency target: what the class is worth now, the quote (the gateway's rule: the
        # tenant's cap when nothing is quoted, and never above it).
        self.cap = cap
        self.worth: float | None = None
        if spec.strategy.startswith("pacing") or spec.strategy == "target":
            target_rate = spec.budget / setup.period_s
            mu_max = mu_max_for(
                value_max=min(value_max, cap),
                arrival_rate=rate,
                wait_bound_s=MU_MAX_WAIT_BOUND_S,
                target_rate=target_rate,
            )
            self.agent = PacingAgent(
                budget=spec.budget,
                period_s=setup.period_s,
                values={"any": 1.0},
                updates=setup.updates,
                eta0=spec.eta0,
                mu_max=mu_max,
                mu=min(spec.mu0, mu_max),
                **(_candidate(spec) if spec.strategy in CANDIDATES else DUAL_STEP_ONLY),
            )
        elif spec.strategy.startswith("mu="):
            self.mu = float(spec.strategy[3:])

    @property
    def remaining(self) -> float:
        return max(0.0, self.budget - self.out.paid)

    def requote(self, history: Iterable[Waited]) -> None:
        """Read the quote for the target from the market's recent requests ("quote0": until
        one is found, then held)."""
        held = self.spec.strategy == "quote0" and any(math.isfinite(q) for q in self.out.quotes)
        if self.spec.target is None or held:
            return
        ttft_s, p = self.spec.target
        quoted = quote(bid_groups(history), ttft_s=ttft_s, p=p)
        self.out.quotes.append(math.nan if quoted is None else quoted)
        self.worth = self.cap if quoted is None else min(quoted, self.cap)

    def bid(self, rid: str, value: float, bound: float) -> float:
        s = self.spec.strategy
        if s == "zero":
            return 0.0
        if s == "free":
            return value
        if s in ("target", "quote0"):
            value = self.cap if self.worth is None else self.worth
        elif s == "quote-median":
            value = self.spec.fixed_bid
        mu = self.agent.mu if self.agent is not None else self.mu
        shaded = value / (1.0 + mu)
        if self.throttled:  # the full value, with probability 1 / (1 + mu); the same draw a seed
            draw = random.Random(f"{self.spec.seed}:{rid}").random()
            shaded = value if draw * (1.0 + mu) < 1.0 else 0.0
        bid = safe_bid(
            shaded=shaded,
            remaining=self.remaining,
            in_flight=self.in_flight_total,
            factor=self.exposure.factor,
            wait_bound_s=bound,
        )
        self.out.value += value
        if bid == 0 and shaded > 0:
            self.out.forced_zero += 1
            self.out.forced_zero_value += value
            self.interval_forced += 1
        if bid > 0:
            self.in_flight[rid] = bid * bound
            self.in_flight_total += bid * bound
        return bid

    def settle(self, rid: str, charge: float, t: float, start: float, period_s: float) -> None:
        out = self.out
        out.settled += 1
        worst = self.in_flight.pop(rid, None)
        if worst is not None:
            self.exposure.observe(charge=charge, worst_case=worst)
            self.in_flight_total = max(0.0, self.in_flight_total - worst)
        consented = charge if worst is None else min(charge, worst)
        out.consent_cut += charge - consented
        paid = min(consented, self.remaining)
        out.uncollected += consented - paid
        out.paid += paid
        out.per_request[rid] = out.per_request.get(rid, 0.0) - paid
        self.interval_spent += paid
        out.peak = max(out.peak, out.paid)
        quarter = min(3, max(0, int(4 * (t - start) / period_s)))
        out.quarters[quarter] += paid

    def tick(self, t: float, interval_s: float, in_period: bool) -> None:
        agent = self.agent
        if agent is not None:
            agent.observe(self.interval_spent, interval_s)
            if in_period:
                self.out.at_mu_max += agent.mu >= agent.mu_max
                self.out.guard_held = agent.guard_held
        self.exposure.update()
        reserve = self.exposure.factor * self.in_flight_total
        mu = agent.mu if agent else self.mu
        self.out.curve.append((t, self.out.paid, mu, reserve, self.interval_forced))
        self.interval_spent, self.interval_forced = 0.0, 0


def run(spec: Spec, setup: Setup = Setup()) -> Outcome:
    """One run in virtual time: the focal tenant's outcome."""
    reqs = workload(spec.seed, setup)
    start, end = WARMUP_S, WARMUP_S + setup.period_s
    mine = [r for r in reqs if r.tenant == spec.tenant]
    focal_ids = {r.id for r in mine if start <= r.arrival < end}  # its budgeted requests
    values = {r.id: r.bid for r in reqs}
    # mu_max from what the tenant's warm-up showed: its top value and its arrival rate.
    seen = [r.bid for r in mine if r.arrival < start]
    # A target class's cap (the tenant's priority_bid_cap live): its warm-up values' 90th
    # percentile, what it would pay for one request in ten.
    cap = percentile(seen, TARGET_CAP_PERCENTILE) if seen else 1.0
    focal = _Focal(spec, setup, len(seen) / start, max(seen, default=1.0), cap)
    focal.out.requests = len(focal_ids)
    focal.out.spec_updates = setup.updates
    knobs = MarketKnobs(book_interval_s=None, charge_scope=setup.charge_scope)
    engine = Engine(EngineConfig(), POLICY, knobs=knobs)
    interval = setup.period_s / setup.updates
    next_tick = [start + interval]
    pending = set(focal_ids)
    # What the market's served requests bid and waited, newest last (the quote's history).
    history: deque[Waited] = deque(maxlen=HISTORY_MAX)
    next_quote = [start]

    class Arrivals(ArrivalQueue):
        def pop_due(self, now: float) -> list[SimRequest]:
            due = super().pop_due(now)
            if due:
                bound = max(MIN_WAIT_BOUND_S, WAIT_BOUND_FACTOR * engine.queue_drain_s())
                for req in due:
                    value = values[req.id]
                    req.bid = focal.bid(req.id, value, bound) if req.id in focal_ids else value
            return due

    def on_step(step) -> None:
        if step.end >= next_quote[0]:
            focal.requote(history)
            next_quote[0] = step.end + QUOTE_REFRESH_S
        if step.record is not None:
            for adm in step.record["admitted"]:
                rid = adm["request_id"]
                if rid in focal_ids:
                    pending.discard(rid)
                    focal.settle(rid, adm["charge"], step.end, start, setup.period_s)
        # Pacing runs over the period and on until the last charge settles.
        while step.end >= next_tick[0] and (next_tick[0] <= end or pending):
            focal.tick(next_tick[0], interval, next_tick[0] <= end + 1e-9)
            next_tick[0] += interval

    def on_finished(req: SimRequest) -> None:
        history.append(Waited(bid=req.bid, ttft_s=req.ttft))
        if req.id in focal_ids:
            if spec.target is not None and req.ttft <= spec.target[0]:
                focal.out.met += 1
            cost = values[req.id] * req.ttft
            focal.out.cost += cost
            focal.out.per_request[req.id] = focal.out.per_request.get(req.id, 0.0) - cost

    owner = {BACKGROUND: ""}  # background: many small tenants, each its own
    queue = Arrivals(
        [SimRequest(r.id, r.tokens, r.max_new_tokens, 0.0, r.arrival, owner.get(r.tenant, r.tenant))
         for r in reqs]
    )  # fmt: skip
    run_virtual(engine, queue, on_step=on_step, on_finished=on_finished)
    out = focal.out
    if focal.agent is not None:
        mus = [mu for _, mu, _ in focal.agent.history[: setup.updates]]
        out.mu_end = mus[-1] if mus else 0.0
        out.mu_mean = statistics.fmean(mus) if mus else 0.0
    else:
        out.mu_end = out.mu_mean = focal.mu
    return out


def _run(args: tuple[Spec, Setup]) -> Outcome:
    return run(*args)


@dataclass
class Scored:
    """A run's outcome scored against the same seed's zero run."""

    spec: Spec
    utility: float
    spend_over_budget: float
    peak_spend_over_budget: float
    uncollected_over_budget: float
    consent_cut_over_budget: float
    top5_utility_share: float
    quarters: list[float]
    mu_end: float
    mu_mean: float
    requests: int
    forced_zero_share: float  # of the period's requests, bid 0 by the exposure reserve
    forced_zero_value_share: float  # their share of the period's values
    at_mu_max_share: float  # of the period's pacing updates, ended at mu_max
    guard_held: float  # log(1 + mu) the end guard held back
    curve: list[tuple[float, float, float, float, int]] = field(repr=False, default_factory=list)


def scored(out: Outcome, zero: Outcome) -> Scored:
    """Utility over bidding 0 (per request: its saved waiting cost less what it paid)."""
    utility = zero.cost - out.cost - out.paid
    # per_request holds -(v x TTFT) - paid per request; the zero run's, -(v x TTFT | zero).
    gains = [v - zero.per_request.get(rid, 0.0) for rid, v in out.per_request.items()]
    top5 = sum(sorted(gains, reverse=True)[:5])
    budget = out.spec.budget
    finite = math.isfinite(budget) and budget > 0
    spend = sum(out.quarters)
    return Scored(
        spec=out.spec,
        utility=utility,
        spend_over_budget=out.paid / budget if finite else math.nan,
        peak_spend_over_budget=out.peak / budget if finite else math.nan,
        uncollected_over_budget=out.uncollected / budget if finite else math.nan,
        consent_cut_over_budget=out.consent_cut / budget if finite else math.nan,
        top5_utility_share=top5 / utility if utility else math.nan,
        quarters=[q / spend if spend else 0.0 for q in out.quarters],
        mu_end=out.mu_end,
        mu_mean=out.mu_mean,
        requests=out.requests,
        forced_zero_share=out.forced_zero / out.requests if out.requests else 0.0,
        forced_zero_value_share=out.forced_zero_value / out.value if out.value else 0.0,
        at_mu_max_share=out.at_mu_max / out.spec_updates if out.spec_updates else 0.0,
        guard_held=out.guard_held,
        curve=out.curve,
    )


class Runner:
    """Runs specs in worker processes, with a progress bar counting to ``total`` runs; closes
    both when its ``with`` block ends."""

    def __init__(self, setup: Setup, workers: int, total: int) -> None:
        self.setup = setup
        self.progress = Progress(total, enabled=True)
        self._pool = multiprocessing.get_context("fork").Pool(workers) if workers > 1 else None

    def __enter__(self) -> Runner:
        return self

    def many(self, specs: Iterable[Spec], label: str) -> list[Outcome]:
        self.progress.set_label(label)
        jobs = [(s, self.setup) for s in specs]
        out = []
        it = self._pool.imap(_run, jobs, chunksize=1) if self._pool is not None else map(_run, jobs)
        for o in it:
            out.append(o)
            self.progress.advance()
        return out

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
        self.progress.close()


def _bases(runner: Runner, seeds: Sequence[int], tenants: Sequence[str], target=None):
    """Per (seed, tenant): the free run (its spend sets the budgets) and the zero run."""
    specs = [Spec(s, t, k, target=target) for s in seeds for t in tenants for k in ("free", "zero")]
    outs = runner.many(specs, "free and zero runs")
    free = {(o.spec.seed, o.spec.tenant): o for o in outs if o.spec.strategy == "free"}
    zero = {(o.spec.seed, o.spec.tenant): o for o in outs if o.spec.strategy == "zero"}
    return free, zero


def _budgeted(spec: Spec, free: Outcome, share: float) -> Spec:
    return replace(spec, budget=free.paid * share, share=share)


def train(
    runner: Runner,
    *,
    tenants,
    shares,
    seeds,
    eta0s,
    grid,
    design: str = "path",
    gains=(CANDIDATE_PATH_GAIN,),
) -> dict:
    """The training seeds: the fixed grid (its best mu per tenant and share), eta0 and the
    candidate ``design``'s gain for pacing (the best mean utility ratio over the binding shares,
    among those that spent 0.95-1.00 of the budget on every training seed), and the warm starts
    (the mean mu each pacing design ended at). The baseline design (``pacing-dual``: the dual
    step alone, ``DUAL_STEP_ONLY``) runs at its own tuned eta0, ``DEFAULT_ETA0``; every design's
    training figures are kept (``designs``): the comparison is made before any held-out seed is
    run."""
    free, zero = _bases(runner, seeds, tenants)
    specs = []
    for s, t, share in itertools.product(seeds, tenants, shares):
        specs += [_budgeted(Spec(s, t, f"mu={mu:g}"), free[s, t], share) for mu in grid]
        specs += [
            _budgeted(Spec(s, t, "pacing", eta0=e, design=design, gain=k), free[s, t], share)
            for e in eta0s
            for k in gains
        ]
        specs.append(_budgeted(Spec(s, t, "pacing-dual", eta0=DEFAULT_ETA0), free[s, t], share))
    runs = [scored(o, zero[o.spec.seed, o.spec.tenant]) for o in runner.many(specs, "training")]
    best_fixed: dict[tuple[str, float], str] = {}
    fixed_curve: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for t, share in itertools.product(tenants, shares):
        means = [
            (mu, statistics.fmean([r.utility for r in runs if _is(r, t, share, f"mu={mu:g}")]))
            for mu in grid
        ]
        fixed_curve[t, share] = means
        best_fixed[t, share] = f"mu={max(means, key=lambda m: m[1])[0]:g}"
    binding = [s for s in shares if s in BINDING]

    def tuned(r: Scored, eta0: float, gain: float) -> bool:
        return r.spec.eta0 == eta0 and r.spec.gain == gain

    def trained(strategy: str, eta0: float, gain: float) -> tuple[bool, float, dict]:
        """Whether a design spent 0.95-1.00 on every training seed of every binding row, its
        mean utility ratio to the best fixed, and per row its spend range and mean ratio."""
        ratios, ok, rows = [], True, {}
        for t, share in itertools.product(tenants, binding):
            paced = [r for r in runs if _is(r, t, share, strategy) and tuned(r, eta0, gain)]
            best = {r.spec.seed: r.utility for r in runs if _is(r, t, share, best_fixed[t, share])}
            mine = [r.utility / best[r.spec.seed] for r in paced if best[r.spec.seed]]
            spend = [r.spend_over_budget for r in paced]
            rows[f"{t}@{share:g}"] = {
                "spend_min": min(spend), "spend_max": max(spend),
                "utility_ratio": statistics.fmean(mine) if mine else math.nan,
                "uncollected_max": max(r.uncollected_over_budget for r in paced),
            }  # fmt: skip
            ratios += mine
            ok &= all(0.95 <= x <= 1.0 for x in spend)
        return ok, statistics.fmean(ratios) if ratios else -math.inf, rows

    choices = [(*trained("pacing", e, k)[:2], e, k) for e in eta0s for k in gains]
    ok_choices = [c for c in choices if c[0]] or choices
    eta0, gain = max(ok_choices, key=lambda c: c[1])[2:]
    symbol = DESIGNS[design].symbol
    designs = {
        f"pacing eta0={e:g} {symbol}={k:g}": trained("pacing", e, k)[2] for _, _, e, k in choices
    }
    designs["pacing-dual"] = trained("pacing-dual", DEFAULT_ETA0, CANDIDATE_PATH_GAIN)[2]
    warm, warm_dual = {}, {}
    for t, share in itertools.product(tenants, shares):
        for into, strategy, e, k in (
            (warm, "pacing", eta0, gain),
            (warm_dual, "pacing-dual", DEFAULT_ETA0, CANDIDATE_PATH_GAIN),
        ):
            paced = [r for r in runs if _is(r, t, share, strategy) and tuned(r, e, k)]
            into[t, share] = math.expm1(statistics.fmean(math.log1p(r.mu_mean) for r in paced))
    return {
        "best_fixed": best_fixed,
        "fixed_curve": fixed_curve,
        "eta0": eta0,
        "design": design,
        "gain": gain,
        "eta0_choices": [
            {"eta0": e, "gain": k, "spend_ok": o, "mean_ratio": m} for o, m, e, k in choices
        ],
        "designs": designs,
        "warm_mu": warm,
        "warm_mu_dual": warm_dual,
    }


def _is(r: Scored, tenant: str, share: float, strategy: str) -> bool:
    return r.spec.tenant == tenant and r.spec.share == share and r.spec.strategy == strategy


def held_out(runner: Runner, trained: dict, *, tenants, shares, seeds, extras=True) -> dict:
    """The held-out seeds: pacing (warm-started, and cold), the baseline design (warm-started),
    the trained best fixed mu, the full value within the budget, and the free run, scored per
    tenant and share. Without ``extras``, neither the cold start nor the full value runs."""
    free, zero = _bases(runner, seeds, tenants)
    specs = []
    eta0, design, gain = trained["eta0"], trained["design"], trained["gain"]
    for s, t, share in itertools.product(seeds, tenants, shares):
        b, warm, best = free[s, t], trained["warm_mu"][t, share], trained["best_fixed"][t, share]
        dual = trained["warm_mu_dual"][t, share]
        specs += [
            _budgeted(
                Spec(s, t, "pacing", eta0=eta0, design=design, gain=gain, mu0=warm), b, share
            ),
            _budgeted(Spec(s, t, "pacing-dual", eta0=DEFAULT_ETA0, mu0=dual), b, share),
            _budgeted(Spec(s, t, best), b, share),
        ]
        if extras:
            cold = Spec(s, t, "pacing-cold", eta0=eta0, design=design, gain=gain)
            specs.append(_budgeted(cold, b, share))
        if extras and best != "mu=0":
            specs.append(_budgeted(Spec(s, t, "mu=0"), b, share))
    outs = runner.many(specs, "held-out seeds")
    runs = [scored(o, zero[o.spec.seed, o.spec.tenant]) for o in outs]
    free_scored = {k: scored(o, zero[k]) for k, o in free.items()}
    report = {}
    for t, share in itertools.product(tenants, shares):
        report[f"{t}@{share:g}"] = {
            **_summary(t, share, runs, trained, free_scored, seeds),
            "free_spend_mean": statistics.fmean(free[s, t].paid for s in seeds),
        }
    return {"summary": report, "runs": runs}


def _summary(t, share, runs, trained, free_scored, seeds) -> dict:
    best = trained["best_fixed"][t, share]
    fixed = {r.spec.seed: r for r in runs if _is(r, t, share, best)}
    full = {r.spec.seed: r for r in runs if _is(r, t, share, "mu=0")}
    by_seed = {r.spec.seed: r for r in runs if _is(r, t, share, "pacing")}
    cold_by_seed = {r.spec.seed: r for r in runs if _is(r, t, share, "pacing-cold")}
    order = [s for s in seeds if s in by_seed]
    free = {s: free_scored[s, t] for s in order}

    def ratios(mine, base=fixed):
        """Utility over ``base``'s per seed; a seed where ``base`` gained nothing (a short
        period can admit none of the tenant's requests) has no ratio."""
        return [mine[s].utility / base[s].utility for s in order if base[s].utility]

    def avg(attr: str) -> float:  # the pacing runs' mean over the seeds
        return statistics.fmean(getattr(by_seed[s], attr) for s in order)

    r_warm, r_cold = ratios(by_seed), ratios(cold_by_seed) if cold_by_seed else []
    mean, lo, hi = interval(r_warm)
    diff = interval([by_seed[s].utility - fixed[s].utility for s in order])
    out = {
        "tenant": t,
        "budget_share": share,
        "binding": share in BINDING,
        "best_fixed_on_training": best,
        "eta0": trained["eta0"],
        "design": trained["design"],
        "gain": trained["gain"],
        "warm_start_mu": trained["warm_mu"][t, share],
        "seeds": order,
        "focal_requests_mean": avg("requests"),
        "spend_over_budget": [by_seed[s].spend_over_budget for s in order],
        "peak_spend_over_budget": max(by_seed[s].peak_spend_over_budget for s in order),
        "utility_ratio": mean,
        "utility_ratio_lcb": lo,
        "utility_ratio_ucb": hi,
        "utility_ratio_per_seed": r_warm,
        "utility_minus_best_fixed": {"mean": diff[0], "ci95": [diff[1], diff[2]]},
        "utility_ratio_cold_start": interval(r_cold)[0] if cold_by_seed else math.nan,
        "spend_over_budget_cold_start": [
            cold_by_seed[s].spend_over_budget for s in order if s in cold_by_seed
        ],
        "uncollected_over_budget": max(by_seed[s].uncollected_over_budget for s in order),
        "uncollected_over_budget_mean": avg("uncollected_over_budget"),
        "consent_cut_over_budget_mean": avg("consent_cut_over_budget"),
        "top5_utility_share": avg("top5_utility_share"),
        "spend_by_quarter": [
            statistics.fmean(by_seed[s].quarters[q] for s in order) for q in range(4)
        ],
        "mu_end": [by_seed[s].mu_end for s in order],
        "utility": avg("utility"),
        "best_fixed_utility": statistics.fmean(fixed[s].utility for s in order),
        "free_utility": statistics.fmean(free[s].utility for s in order),
        "free_spend_by_quarter": [
            statistics.fmean(free[s].quarters[q] for s in order) for q in range(4)
        ],
        "utility_over_free": interval(ratios(by_seed, free))[0],
    }
    if full:
        out["full_value_ratio"] = interval(ratios(full))[0]
        out["full_value_spend_over_budget"] = [full[s].spend_over_budget for s in order]
    dual = {r.spec.seed: r for r in runs if _is(r, t, share, "pacing-dual")}
    if dual:
        r_dual = ratios(dual)
        out["baseline"] = {  # the dual step alone, as before issue 50
            "warm_start_mu": trained["warm_mu_dual"][t, share],
            "spend_over_budget": [dual[s].spend_over_budget for s in order],
            "utility_ratio": interval(r_dual)[0],
            "utility_ratio_lcb": interval(r_dual)[1],
            "utility_ratio_per_seed": r_dual,
            "uncollected_over_budget": max(dual[s].uncollected_over_budget for s in order),
        }
    out["diagnosis"] = {
        name: [_diagnosis(runs_of[s], free[s]) for s in _worst(runs_of, order)]
        for name, runs_of in (("pacing", by_seed), ("pacing-dual", dual))
        if runs_of
    }
    return out


DIAGNOSED = 3  # the worst seeds of a row (by spend / budget) diagnosed in the report


def _worst(by_seed: dict[int, Scored], order: Sequence[int]) -> list[int]:
    """The ``DIAGNOSED`` seeds that spent the smallest share of their budget."""
    return sorted(order, key=lambda s: by_seed[s].spend_over_budget)[:DIAGNOSED]


def _diagnosis(r: Scored, free: Scored) -> dict:
    """Where a run's unspent budget went: how often the multiplier sat at mu_max, how many
    requests the exposure reserve bid 0, what the end guard held back, and the spend by
    quarter against what the same seed spends at its full values with no budget."""
    return {
        "seed": r.spec.seed,
        "spend_over_budget": r.spend_over_budget,
        "unspent_over_budget": 1.0 - r.spend_over_budget,
        "at_mu_max_share": r.at_mu_max_share,
        "forced_zero_share": r.forced_zero_share,
        "forced_zero_value_share": r.forced_zero_value_share,
        "guard_held": r.guard_held,
        "mu_mean": r.mu_mean,
        # Dollars by quarter of the period over the budget: this run's, and the free run's (its
        # spend is the budget / the share).
        "spend_by_quarter": [q * r.spend_over_budget for q in r.quarters],
        "free_spend_by_quarter": [q / r.spec.share for q in free.quarters],
        "curve": plotted(r.curve),
    }


PLOT_FIGURES = 4  # significant figures a curve keeps in the JSON (it is only plotted)


def plotted(curve: Sequence[tuple[float, ...]]) -> list[tuple[float, ...]]:
    """A curve as the report plots it: each number to ``PLOT_FIGURES`` significant figures (a
    run's curves are most of its JSON)."""
    return [
        tuple(x if isinstance(x, int) else float(f"{x:.{PLOT_FIGURES}g}") for x in point)
        for point in curve
    ]


def target_case(runner: Runner, target: tuple[float, float], *, tenants, shares, seeds) -> dict:
    """The focal tenant's requests as one class with a latency target (TTFT seconds,
    probability), on the held-out seeds, under each budget share: the autobidder bidding the
    quote paced ("target"), the period's first quote as a fixed bid ("quote0"), the median of
    the quotes "target" read ("quote-median"), and the tenant's values ("mu=0"), all within
    the same budget by the same safety rule; "zero" and "free" for reference. Per strategy:
    the share of the period's requests served within the TTFT, and spend / budget, per seed."""
    free, zero = _bases(runner, seeds, tenants, target)
    outs = [*free.values(), *zero.values()]
    specs = [
        _budgeted(Spec(s, t, k, target=target), free[s, t], share)
        for s in seeds
        for t in tenants
        for share in shares
        for k in TARGET_STRATEGIES
        if k != "quote-median"
    ]
    outs += runner.many(specs, "latency target")
    second = [
        replace(o.spec, strategy="quote-median", fixed_bid=statistics.median(quoted))
        for o in outs
        if o.spec.strategy == "target" and (quoted := [q for q in o.quotes if math.isfinite(q)])
    ]
    outs += runner.many(second, "latency target: the median quote, fixed")
    summary: dict[str, dict] = {}
    for t, share in itertools.product(tenants, (math.inf, *shares)):
        for k in ("zero", "free") if share == math.inf else TARGET_STRATEGIES:
            mine = [o for o in outs if (o.spec.tenant, o.spec.share, o.spec.strategy) == (
                t, share, k)]  # fmt: skip
            if not mine:
                continue
            met = [o.met / o.requests for o in mine if o.requests]
            spend = [o.paid / o.spec.budget for o in mine if share != math.inf]
            summary[f"{t}@{share:g} {k}"] = {
                "met_share": interval(met),
                "met_share_per_seed": met,
                "spend_over_budget": spend,
                # How often the target was quoted at all (else the class bid the cap), and
                # the first quote read, $/s (nan: none at the period's start).
                "quoted_share": statistics.fmean(
                    math.isfinite(q) for o in mine for q in o.quotes
                ) if any(o.quotes for o in mine) else math.nan,
                "quote_at_start": [o.quotes[0] if o.quotes else math.nan for o in mine],
                "fixed_bid": [o.spec.fixed_bid for o in mine],
            }  # fmt: skip
    # Paired by seed: the autobidder's met share less each fixed bid's, under the same budget.
    paired: dict[str, dict] = {}
    for t, share in itertools.product(tenants, shares):
        met = {
            (o.spec.strategy, o.spec.seed): o.met / o.requests
            for o in outs
            if (o.spec.tenant, o.spec.share) == (t, share) and o.requests
        }
        for k in TARGET_STRATEGIES[1:]:
            diffs = [met["target", s] - met[k, s] for s in seeds if (k, s) in met]
            paired[f"{t}@{share:g} target - {k}"] = {"met_share": interval(diffs)}
    return {"target": {"ttft_s": target[0], "p": target[1]}, "summary": summary, "paired": paired}


def target_table(result: dict) -> str:
    """The latency-target case, one line per tenant, budget share and strategy; then the
    paired differences."""
    ttft_s, p = result["target"]["ttft_s"], result["target"]["p"]
    cells = Table(
        ("tenant@s strategy", "seeds", "met share (95% CI)", "spend/budget mean, max", "quoted"),
        [(key, len(r["met_share_per_seed"]), "{:.3f} ({:.3f}-{:.3f})".format(*r["met_share"]),
          f"{statistics.fmean(spend):.3f}, {max(spend):.3f}" if (spend := r["spend_over_budget"])
          else "-", f"{r['quoted_share']:.2f}") for key, r in result["summary"].items()],
    )  # fmt: skip
    paired = Table(
        ("paired by seed (the seeds both ran)", "met share difference (95% CI)"),
        [(key, "{:+.3f} ({:+.3f} to {:+.3f})".format(*r["met_share"]))
         for key, r in result["paired"].items()],
    )  # fmt: skip
    return f"latency target: TTFT <= {ttft_s:g} s with p = {p:g}\n{cells.text()}\n{paired.text()}"


def table(summary: dict) -> str:
    """The held-out figures, one line per tenant and budget share."""
    columns = (
        "tenant@s", "spend/budget min-max", "peak", "U/best", "LCB", "cold", "full/best",
        "uncoll", "top5", "mu end", "best", "U/free", "spend by quarter",
    )  # fmt: skip
    rows = [
        (key, f"{min(r['spend_over_budget']):.3f} - {max(r['spend_over_budget']):.3f}",
         *(f"{r[k]:.3f}" for k in ("peak_spend_over_budget", "utility_ratio",
                                   "utility_ratio_lcb", "utility_ratio_cold_start")),
         f"{r['full_value_ratio']:.3f}" if "full_value_ratio" in r else "-",
         f"{r['uncollected_over_budget']:.4f}",
         f"{r['top5_utility_share']:.3f}", f"{percentile(r['mu_end'], 50):.3f}",
         r["best_fixed_on_training"], f"{r['utility_over_free']:.3f}",
         " ".join(f"{q:.2f}" for q in r["spend_by_quarter"]))
        for key, r in summary.items()
    ]  # fmt: skip
    return Table(columns, rows).text()


def figure(result: dict) -> go.Figure:
    """The training grid, the held-out seeds, and one seed's multiplier over the period."""

    summary, trained = result["held_out"], result["training"]
    fig = make_subplots(
        rows=4,
        cols=1,
        subplot_titles=(
            "Training seeds: mean utility of a fixed multiplier (x: 1 + mu, log)",
            "Held-out seeds: utility / best fixed multiplier per seed (1 = as good)",
            "Held-out seeds: spend / budget per seed",
            "One held-out seed: the multiplier over the period",
        ),
        vertical_spacing=0.07,
    )
    for key, curve in trained["fixed_curve"].items():
        x, y = [1 + m for m, _ in curve], [u for _, u in curve]
        fig.add_scatter(x=x, y=y, name=f"{key} fixed", row=1, col=1)
    for key, r in summary.items():
        fig.add_box(y=r["utility_ratio_per_seed"], name=key, boxpoints="all", row=2, col=1)
        fig.add_box(y=r["spend_over_budget"], name=key, boxpoints="all", row=3, col=1)
    for key, curve in result["curves"].items():
        fig.add_scatter(
            x=[c[0] for c in curve], y=[c[2] for c in curve], name=f"{key} mu", row=4, col=1
        )
    fig.update_xaxes(type="log", title_text="1 + mu", row=1, col=1)
    fig.update_yaxes(title_text="utility, $", row=1, col=1)
    fig.add_hline(y=0.9, line_dash="dot", row=2, col=1)
    fig.add_hline(y=1.0, line_dash="dot", row=3, col=1)
    fig.add_hline(y=0.95, line_dash="dot", row=3, col=1)
    fig.update_xaxes(title_text="virtual seconds", row=4, col=1)
    fig.update_yaxes(title_text="mu", type="log", row=4, col=1)
    fig.update_layout(height=1500, showlegend=True)
    return fig


def _figure(x: float | None, spec: str) -> str:
    """``x`` by ``spec``, or "-" when there is none (NaN, or null in a saved JSON)."""
    return "-" if x is None or math.isnan(x) else format(x, spec)


def before_after(summary: dict) -> Table:
    """Per binding row, the rule in force (``pacing-dual``: the dual step alone) and the
    candidate design (``pacing``: its ``design``, the path term in runs that do not say) on the
    held-out seeds: spend / budget over the seeds, the utility ratio's lower confidence bound
    against the best fixed multiplier, the most uncollected."""
    rows = []
    for key, r in summary.items():
        base = r.get("baseline")
        if not r["binding"] or base is None:
            continue
        tried = f"tried: {DESIGNS[r.get('design', 'path')].name}"
        for name, x in (("in force: the dual step", base), (tried, r)):
            spend = x["spend_over_budget"]
            rows.append((key, name, f"{min(spend):.3f}-{max(spend):.3f}",
                         _figure(x["utility_ratio_lcb"], ".3f"),
                         _figure(x["uncollected_over_budget"], ".2%")))  # fmt: skip
    columns = ("tenant @ budget share", "design", "spend / budget over seeds",
               "utility LCB vs best fixed", "uncollected (most)")  # fmt: skip
    return Table(columns, rows)


def designs_table(result: dict) -> Table:
    """The designs compared on the training seeds (before any held-out run)."""
    trained = result["training"]
    rows = [
        (name, key, f"{x['spend_min']:.3f}-{x['spend_max']:.3f}",
         _figure(x["utility_ratio"], ".3f"), _figure(x["uncollected_max"], ".2%"))
        for name, by_row in trained.get("designs", {}).items()
        for key, x in by_row.items()
    ]  # fmt: skip
    columns = ("design", "tenant @ budget share", "spend / budget over training seeds",
               "mean utility / best fixed", "uncollected (most)")  # fmt: skip
    return Table(columns, rows)


def diagnosis_table(summary: dict, designs: Sequence[str] = ("pacing-dual", "pacing")) -> Table:
    """The worst seeds of each binding row, per design: where the unspent budget went."""
    rows = []
    for key, r in summary.items():
        for name in designs:
            if not r["binding"]:
                continue
            rows += [
                (key, name, d["seed"], f"{d['spend_over_budget']:.3f}",
                 f"{d['at_mu_max_share']:.1%}", f"{d['forced_zero_share']:.1%}",
                 f"{d['forced_zero_value_share']:.1%}", f"{d['guard_held']:.2f}",
                 f"{d['mu_mean']:.3g}", r["best_fixed_on_training"],
                 " ".join(f"{q:.2f}" for q in d["spend_by_quarter"]),
                 " ".join(f"{q:.2f}" for q in d["free_spend_by_quarter"]))
                for d in r.get("diagnosis", {}).get(name, [])
            ]  # fmt: skip
    columns = (
        "tenant@s", "design", "seed", "spend / budget", "time at mu_max",
        "requests bid 0 by the reserve", "(their share of value)", "end guard held, log(1+mu)",
        "mu mean", "best fixed", "spend / budget by quarter", "the free run's",
    )  # fmt: skip
    return Table(columns, rows)


def diagnosis_figure(summary: dict, period_s: float) -> go.Figure:
    """Per binding row, its worst seeds: the spend path against the even one, the multiplier,
    and the exposure reserve with the requests it bid 0 (pacing solid, the baseline dotted)."""
    keys = [k for k, r in summary.items() if r["binding"] and r.get("diagnosis")]
    fig = make_subplots(
        rows=max(1, len(keys)),
        cols=3,
        subplot_titles=[
            title
            for k in keys
            for title in (
                f"{k}: spend / budget (even path dashed)",
                f"{k}: mu",
                f"{k}: reserve / budget; x: requests bid 0 by it",
            )
        ],
        vertical_spacing=0.04,
        horizontal_spacing=0.06,
    )
    palette = ("#1f77b4", "#d62728", "#2ca02c")
    for row, key in enumerate(keys, start=1):
        r = summary[key]
        budget_share = r["budget_share"]
        for name, seeds in r["diagnosis"].items():
            dash = "solid" if name == "pacing" else "dot"
            for k, d in enumerate(seeds):
                spend = d["spend_over_budget"]
                curve = d["curve"]  # the period's updates, then on until the last charge
                x = [c[0] - WARMUP_S for c in curve]
                paid = curve[-1][1] if curve else 0.0
                scale = spend / paid if paid else 0.0  # dollars -> share of the budget
                label = f"{key} {name} seed {d['seed']} ({spend:.3f})"
                line = {"color": palette[k % len(palette)], "dash": dash}
                fig.add_scatter(x=x, y=[c[1] * scale for c in curve], name=label, line=line,
                                legendgroup=label, row=row, col=1)  # fmt: skip
                fig.add_scatter(x=x, y=[c[2] for c in curve], name=label, line=line,
                                legendgroup=label, showlegend=False, row=row, col=2)  # fmt: skip
                fig.add_scatter(x=x, y=[c[3] * scale for c in curve], name=label, line=line,
                                legendgroup=label, showlegend=False, row=row, col=3)  # fmt: skip
                forced = [(c[0] - WARMUP_S, c[3] * scale) for c in curve if c[4]]
                fig.add_scatter(x=[f[0] for f in forced], y=[f[1] for f in forced],
                                mode="markers", marker={"symbol": "x", "color": line["color"]},
                                name=label, legendgroup=label, showlegend=False, row=row,
                                col=3)  # fmt: skip
        even = {"color": "grey", "dash": "dash"}
        fig.add_scatter(x=[0, period_s], y=[0, 1.0], mode="lines", line=even, name="even path",
                        showlegend=row == 1, row=row, col=1)  # fmt: skip
        fig.update_yaxes(type="log", row=row, col=2)
        fig.update_yaxes(title_text=f"s = {budget_share:g}", row=row, col=1)
    fig.update_xaxes(title_text="seconds of the period")
    fig.update_layout(height=330 * max(1, len(keys)), showlegend=True)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=Setup.rate, help="arrivals a second")
    parser.add_argument("--period", type=float, default=Setup.period_s, help="seconds")
    parser.add_argument("--updates", type=int, default=UPDATES, help="pacing updates a period")
    parser.add_argument(
        "--charge-scope",
        default=Setup.charge_scope,
        choices=("tenant", "request"),
        help="tenant-level charges (the default) or the per-request ones",
    )
    parser.add_argument("--tenants", default=",".join(TENANTS))
    parser.add_argument("--shares", type=floats, default=BUDGET_SHARES)
    parser.add_argument("--train-seeds", type=int, default=len(TRAIN_SEEDS))
    parser.add_argument("--held-out-seeds", type=int, default=len(HELD_OUT_SEEDS))
    parser.add_argument(
        "--eta0",
        type=floats,
        default=ETA0_GRID,
        help="eta0 values tuned over on the training seeds",
    )
    parser.add_argument(
        "--design",
        choices=tuple(DESIGNS),
        default="path",
        help="the candidate design run beside the rule in force: "
        + "; ".join(f"{k}: {d.name}, gain {d.symbol}" for k, d in DESIGNS.items()),
    )
    parser.add_argument(
        "--gain",
        "--path-gain",
        type=floats,
        help="the candidate's gains tuned over (with eta0) on the training seeds; its design's "
        "grid unless given",
    )
    parser.add_argument("--grid", type=int, default=len(MU_GRID), help="fixed mu points used")
    parser.add_argument("--workers", type=int, default=max(1, multiprocessing.cpu_count()))
    parser.add_argument(
        "--latency-target",
        metavar="TTFT_S,P",
        help="run only the latency-target case (held-out seeds): the focal tenant's class asks "
        "for a first token within TTFT_S seconds with probability P",
    )
    parser.add_argument(
        "--no-extras",
        action="store_true",
        help="on the held-out seeds, run neither the cold start nor the full values (fewer runs)",
    )
    parser.add_argument("--json", help="write the result to this file")
    parser.add_argument("--html", help="write a Plotly report to this file")
    args = parser.parse_args(argv)
    setup = Setup(
        rate=args.rate, period_s=args.period, updates=args.updates, charge_scope=args.charge_scope
    )
    tenants = [t for t in args.tenants.split(",") if t]
    design = DESIGNS[args.design]
    shares, eta0s, gains = list(args.shares), list(args.eta0), list(args.gain or design.grid)
    step = max(1, len(MU_GRID) // args.grid) if args.grid < len(MU_GRID) else 1
    grid = MU_GRID[::step]
    train_seeds = TRAIN_SEEDS[: args.train_seeds]
    held = HELD_OUT_SEEDS[: args.held_out_seeds]
    result: dict = {"command": command_line("benchmarks.pacing", argv), "setup": asdict(setup)}
    if args.latency_target:
        result |= _target_run(args.latency_target, setup, args.workers, tenants, shares, held)
        text = target_table(result["latency_target"])
        title = "Autobidding to a latency target on the simulated engine"
    else:
        n_train = (
            len(train_seeds)
            * len(tenants)
            * (2 + len(shares) * (len(grid) + len(eta0s) * len(gains) + 1))
        )
        n_held = len(held) * len(tenants) * (2 + len(shares) * (3 if args.no_extras else 5))
        with Runner(setup, args.workers, n_train + n_held) as runner:
            trained = train(
                runner,
                tenants=tenants,
                shares=shares,
                seeds=train_seeds,
                eta0s=eta0s,
                grid=grid,
                design=args.design,
                gains=gains,
            )
            held_result = held_out(
                runner, trained, tenants=tenants, shares=shares, seeds=held,
                extras=not args.no_extras,
            )  # fmt: skip
        curves = {
            f"{r.spec.tenant}@{r.spec.share:g}": plotted(r.curve)
            for r in held_result["runs"]
            if r.spec.seed == held[0] and r.spec.strategy == "pacing"
        }
        result |= {
            "train_seeds": list(train_seeds),
            "held_out_seeds": list(held),
            "mu_grid": list(grid),
            "training": trained,
            "held_out": held_result["summary"],
            "curves": curves,
        }
        text, title = table(result["held_out"]), "Autobidder pacing on the simulated engine"
    print(text)
    if args.json:
        write_json(args.json, result)
    if args.html:
        sections = [Section("Held-out seeds", text)]
        if not args.latency_target:
            summary = result["held_out"]
            sections = [
                Section("Held-out seeds", text, figures=[figure(result)]),
                Section(f"The rule in force (the dual step) and the candidate ({design.name})",
                        tables=[before_after(summary)]),
                Section("Designs on the training seeds", tables=[designs_table(result)]),
                Section("Where the unspent budget went: the worst seeds of each row",
                        tables=[diagnosis_table(summary)],
                        figures=[diagnosis_figure(summary, setup.period_s)]),
            ]  # fmt: skip
        write_page(args.html, title, sections, command=result["command"])
    return 0


def _target_run(target: str, setup: Setup, workers: int, tenants, shares, seeds) -> dict:
    """The latency-target case (``--latency-target TTFT_S,P``) on the held-out ``seeds``."""
    ttft_s, p = (float(x) for x in target.split(","))
    if not (ttft_s > 0 and 0 < p < 1):
        raise SystemExit(f"--latency-target: want TTFT_S > 0 and 0 < P < 1, got {ttft_s}, {p}")
    n = len(seeds) * len(tenants) * (2 + len(shares) * len(TARGET_STRATEGIES))  # at most
    with Runner(setup, workers, n) as runner:
        case = target_case(runner, (ttft_s, p), tenants=tenants, shares=shares, seeds=seeds)
    return {"held_out_seeds": list(seeds), "latency_target": case}


if __name__ == "__main__":
    sys.exit(main())
