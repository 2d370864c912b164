"""Does the autobidder pace? ``python -m benchmarks.pacing`` (DESIGN.md 4.6).

Tenants share one simulated engine in virtual time over a generated-shared-prefix workload.
Each request has a value (dollars per second of waiting, drawn like the two-class bids, scaled
per tenant) and belongs to a tenant. Most of the traffic is background: tenants without a
budget who bid their values. Three budgeted tenants bid through their agents at each request's
arrival and pay the priority charges of their admitted requests (token charges are the same
whatever they bid, so they are left out), never more than the request's hold: bid x a bound on
its wait (the engine's queue drain time at arrival), held against the budget until the request
is admitted, as the gateway does. A tenant's budget is a share of what it spends bidding its
full values with no budget.

For each budgeted tenant in turn (the others pacing), the run is repeated with that tenant
using its pacing agent; the naive agent (full value until the money runs out); a fixed
multiplier mu (bid value / (1 + mu), within the same budget bound) for each mu of a grid; and
bids of 0. Its utility is the waiting cost it saved over bidding 0 minus what it paid:

    U = sum(v x TTFT | bids 0) - sum(v x TTFT) - payments        (dollars)

Every figure is the mean over several seeds (arrivals, values and tenants drawn anew), since
one tenant's bids reshuffle the whole schedule and a single run is noisy. The best fixed
multiplier in hindsight is the grid's best one among those that kept within the budget.
Reported: spend / budget at the end and at its peak, utility, and utility / best in hindsight.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from engines.sim import Engine, EngineConfig, SimRequest
from engines.sim.driver import ArrivalQueue, run_virtual
from market.mechanism.pacing import PacingAgent
from scheduler_bridge.contract.knobs import MarketKnobs

from .progress import Progress
from .workloads import BenchRequest, gsp

TENANTS = ("A", "B", "C")  # the budgeted tenants
BACKGROUND = "bg"
# Share of the requests, value scale (x the drawn value) and budget (x full-value spend).
TRAFFIC = {"bg": 0.6, "A": 0.2, "B": 0.12, "C": 0.08}
VALUE_SCALE = {"bg": 1.0, "A": 1.0, "B": 2.0, "C": 0.5}
BUDGET_SHARES = {"A": 0.6, "B": 0.4, "C": 0.25}
MU_GRID = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 20.0)
STEPS_PER_RUN = 60  # pacing updates over the arrival span
# The budget cap's bound on a request's planned wait: the time the engine needs to prefill what
# waits when the request arrives (the mechanism's planned wait at bid 0 if nothing else came),
# and at least this many seconds. The queue can grow before the request is admitted, so the
# charge can exceed bid x bound; it is then capped at the hold.
MIN_WAIT_BOUND_S = 0.05
POLICY = "dfs-auction-density"


@dataclass
class Bidder:
    """How one tenant bids: a strategy name, its agent state and what it spent."""

    strategy: str  # "pacing", "naive", "zero", "value" (background) or "mu=<x>"
    budget: float  # dollars for the run (inf: none)
    agent: PacingAgent | None = None
    mu: float = 0.0
    spent: float = 0.0
    held: float = 0.0  # holds of its requests still waiting, dollars
    interval_spent: float = 0.0
    peak_share: float = 0.0
    curve: list[tuple[float, float, float]] = field(default_factory=list)  # (t, spent, mu)

    @property
    def remaining(self) -> float:
        """Budget neither spent nor held, dollars."""
        return max(0.0, self.budget - self.spent - self.held)

    def bid(self, value: float, max_wait_s: float) -> tuple[float, float]:
        """The bid ($/s) for a request worth ``value``, shaded and within the budget bound, and
        the hold it takes (bid x max_wait_s, never more than what is left)."""
        if self.strategy == "zero":
            return 0.0, 0.0
        if self.strategy == "value":
            return value, 0.0
        mu = self.agent.mu if self.agent is not None else self.mu
        shade = 0.0 if self.strategy == "naive" else mu
        bid = min(value / (1.0 + shade), self.remaining / max_wait_s)
        self.held += bid * max_wait_s
        return bid, bid * max_wait_s

    def pay(self, charge: float, hold: float) -> None:
        """Pay a priority charge, never more than the request's hold, and release the hold:
        the gateway holds that much before forwarding and settles no more, which is what keeps
        a budget from being overspent."""
        charge = min(charge, hold)
        self.held = max(0.0, self.held - hold)
        self.spent += charge
        self.interval_spent += charge
        if self.budget != float("inf") and self.budget > 0:
            self.peak_share = max(self.peak_share, self.spent / self.budget)

    def tick(self, now: float, interval_s: float) -> None:
        """One pacing step over the last interval."""
        if self.agent is not None:
            self.agent.observe(self.interval_spent, interval_s)
        self.interval_spent = 0.0
        self.curve.append((now, self.spent, self.agent.mu if self.agent else self.mu))


@dataclass(frozen=True)
class TenantResult:
    """A tenant's outcome under one strategy (dollars)."""

    strategy: str
    spent: float
    budget: float
    peak_share: float
    cost: float  # sum of value x TTFT over its requests
    utility: float = 0.0


def _workload(requests: int, load_rps: float, seed: int) -> list[tuple[BenchRequest, str, float]]:
    """The run's requests with arrival times, each with its tenant and value ($/s)."""
    groups = 32
    base = gsp(
        num_groups=groups,
        prompts_per_group=max(1, requests // groups),
        output_len=64,
        seed=seed,
    ).at_rate(load_rps, seed)
    rng = random.Random(f"{seed}:tenants")
    names, weights = list(TRAFFIC), list(TRAFFIC.values())
    out = []
    for r in base.requests:
        tenant = rng.choices(names, weights)[0]
        out.append((r, tenant, r.bid * VALUE_SCALE[tenant]))
    return out


def simulate(
    reqs: Sequence[tuple[BenchRequest, str, float]],
    bidders: dict[str, Bidder],
    config: EngineConfig,
) -> dict[str, float]:
    """One run in virtual time; returns each tenant's sum of value x TTFT (dollars)."""
    engine = Engine(config, POLICY, knobs=MarketKnobs(book_interval_s=None))
    owner = {r.id: (tenant, value) for r, tenant, value in reqs}
    span = max(r.arrival for r, _, _ in reqs)
    interval = span / STEPS_PER_RUN
    for b in bidders.values():
        if b.strategy == "pacing":
            b.agent = PacingAgent(budget=b.budget, period_s=span, values={"any": 1.0})
    next_tick = [interval]
    queue = _BiddingQueue([_sim(r) for r, _, _ in reqs], owner, bidders, engine)
    cost = dict.fromkeys(bidders, 0.0)

    def on_step(step) -> None:
        if step.record is not None:
            for adm in step.record["admitted"]:
                rid = adm["request_id"]
                bidders[owner[rid][0]].pay(adm["charge"], queue.holds.pop(rid))
        while step.end >= next_tick[0] and next_tick[0] <= span:
            for b in bidders.values():
                b.tick(next_tick[0], interval)
            next_tick[0] += interval

    def on_finished(req: SimRequest) -> None:
        tenant, value = owner[req.id]
        cost[tenant] += value * req.ttft

    run_virtual(engine, queue, on_step=on_step, on_finished=on_finished)
    return cost


class _BiddingQueue(ArrivalQueue):
    """Arrivals whose bids are decided by their tenant's bidder when they arrive."""

    def __init__(self, requests, owner, bidders, engine: Engine) -> None:
        super().__init__(requests)
        self._owner = owner
        self._bidders = bidders
        self._engine = engine
        self.holds: dict[str, float] = {}  # request id -> its hold's priority part, dollars

    def pop_due(self, now: float) -> list[SimRequest]:
        due = super().pop_due(now)
        if due:
            bound = max(MIN_WAIT_BOUND_S, self._engine.queue_drain_s())
            for req in due:
                tenant, value = self._owner[req.id]
                req.bid, self.holds[req.id] = self._bidders[tenant].bid(value, bound)
        return due


def _sim(r: BenchRequest) -> SimRequest:
    return SimRequest(r.id, r.tokens, r.max_new_tokens, 0.0, r.arrival)


def _mean(results: list[TenantResult]) -> TenantResult:
    n = len(results)
    return TenantResult(
        results[0].strategy,
        sum(r.spent for r in results) / n,
        sum(r.budget for r in results) / n,
        max(r.peak_share for r in results),
        sum(r.cost for r in results) / n,
        sum(r.utility for r in results) / n,
    )


def evaluate_seed(
    *, requests: int, load_rps: float, seed: int, progress: Callable[[str], None]
) -> tuple[dict[str, float], dict[str, dict[str, TenantResult]], dict[str, list]]:
    """One seed: budgets, every budgeted tenant against every strategy, the pacing curves."""
    config = EngineConfig()
    reqs = _workload(requests, load_rps, seed)
    progress(f"seed {seed}: full-value spend")
    free = {t: Bidder("naive", float("inf")) for t in TENANTS}
    free[BACKGROUND] = Bidder("value", float("inf"))
    simulate(reqs, free, config)
    budgets = {t: free[t].spent * BUDGET_SHARES[t] for t in TENANTS}
    results: dict[str, dict[str, TenantResult]] = {}
    curves: dict[str, list[tuple[float, float, float]]] = {}
    strategies = ["pacing", "naive", "zero", *(f"mu={mu:g}" for mu in MU_GRID)]
    for tenant in TENANTS:
        results[tenant] = {}
        for strategy in strategies:
            progress(f"seed {seed}: tenant {tenant}, {strategy}")
            bidders = {t: Bidder("pacing", budgets[t]) for t in TENANTS}
            bidders[BACKGROUND] = Bidder("value", float("inf"))
            focal = Bidder(strategy, budgets[tenant])
            if strategy.startswith("mu="):
                focal.mu = float(strategy[3:])
            bidders[tenant] = focal
            cost = simulate(reqs, bidders, config)
            results[tenant][strategy] = TenantResult(
                strategy, focal.spent, focal.budget, focal.peak_share, cost[tenant]
            )
            if strategy == "pacing":
                curves[tenant] = focal.curve
        zero_cost = results[tenant]["zero"].cost
        for name, r in list(results[tenant].items()):
            results[tenant][name] = replace(r, utility=zero_cost - r.cost - r.spent)
    return budgets, results, curves


def evaluate(
    *, requests: int, load_rps: float, seeds: int, progress: Callable[[str], None]
) -> dict[str, object]:
    """Every budgeted tenant against every strategy, averaged over ``seeds`` seeds."""
    per_seed = [
        evaluate_seed(requests=requests, load_rps=load_rps, seed=s, progress=progress)
        for s in range(seeds)
    ]
    budgets = {t: sum(b[t] for b, _, _ in per_seed) / seeds for t in TENANTS}
    results = {
        t: {name: _mean([r[t][name] for _, r, _ in per_seed]) for name in per_seed[0][1][t]}
        for t in TENANTS
    }
    # Spend shares per seed (each seed's own budget), for the table's "spend/budget" columns.
    shares = {
        t: {
            name: [r[t][name].spent / r[t][name].budget for _, r, _ in per_seed]
            for name in per_seed[0][1][t]
        }
        for t in TENANTS
    }
    return {"budgets": budgets, "results": results, "shares": shares, "curves": per_seed[0][2]}


def summary_rows(evaluation: dict[str, object]) -> list[dict[str, object]]:
    """One row per tenant: pacing vs naive vs the best fixed multiplier in hindsight."""
    rows = []
    for tenant, per in evaluation["results"].items():
        shares = evaluation["shares"][tenant]
        fixed = [r for name, r in per.items() if name.startswith("mu=")]
        feasible = [r for r in fixed if r.peak_share <= 1 + 1e-9]
        best = max(feasible or fixed, key=lambda r: r.utility)
        pacing, naive = per["pacing"], per["naive"]
        rows.append(
            {
                "tenant": tenant,
                "budget": pacing.budget,
                "pacing_spend_share": sum(shares["pacing"]) / len(shares["pacing"]),
                "pacing_spend_share_min": min(shares["pacing"]),
                "pacing_spend_share_max": max(shares["pacing"]),
                "pacing_peak_share": pacing.peak_share,
                "pacing_utility": pacing.utility,
                "naive_spend_share": sum(shares["naive"]) / len(shares["naive"]),
                "naive_utility": naive.utility,
                "best_fixed": best.strategy,
                "best_fixed_utility": best.utility,
                "pacing_vs_best": pacing.utility / best.utility if best.utility else float("nan"),
                "naive_vs_best": naive.utility / best.utility if best.utility else float("nan"),
            }
        )
    return rows


def table(rows: list[dict[str, object]]) -> str:
    head = (
        f"{'tenant':<7}{'budget $':>10}{'spend/budget (min-max)':>24}{'peak':>7}{'utility $':>11}"
        f"{'naive spend':>13}{'naive util $':>13}{'best fixed':>11}{'best util $':>12}"
        f"{'pacing/best':>12}{'naive/best':>11}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['tenant']:<7}{r['budget']:>10.3f}{r['pacing_spend_share']:>10.3f}"
            f" ({r['pacing_spend_share_min']:.3f}-{r['pacing_spend_share_max']:.3f})"
            f"{r['pacing_peak_share']:>7.3f}{r['pacing_utility']:>11.2f}"
            f"{r['naive_spend_share']:>13.3f}{r['naive_utility']:>13.2f}{r['best_fixed']:>11}"
            f"{r['best_fixed_utility']:>12.2f}{r['pacing_vs_best']:>12.3f}"
            f"{r['naive_vs_best']:>11.3f}"
        )
    return "\n".join(lines)


def write_html(evaluation: dict[str, object], rows: list[dict[str, object]], path: str) -> None:
    """A self-contained Plotly report: spend and multiplier over time, utility against mu."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=3,
        cols=1,
        subplot_titles=(
            "Pacing: cumulative spend / budget over the run",
            "Pacing: the multiplier mu over the run",
            "Utility against a fixed multiplier (left: pacing at -1, naive at -0.5)",
        ),
        vertical_spacing=0.09,
    )
    budgets = evaluation["budgets"]
    for tenant, curve in evaluation["curves"].items():
        t = [c[0] for c in curve]
        fig.add_trace(
            go.Scatter(x=t, y=[c[1] / budgets[tenant] for c in curve], name=f"{tenant} spend"),
            row=1,
            col=1,
        )
        fig.add_trace(go.Scatter(x=t, y=[c[2] for c in curve], name=f"{tenant} mu"), row=2, col=1)
    for tenant, per in evaluation["results"].items():
        fixed = [(float(n[3:]), r.utility) for n, r in per.items() if n.startswith("mu=")]
        fig.add_trace(
            go.Scatter(x=[m for m, _ in fixed], y=[u for _, u in fixed], name=f"{tenant} fixed mu"),
            row=3,
            col=1,
        )
        # The agents sit left of the grid: pacing at -1, naive (full value) at -0.5.
        for name, symbol, x in (("pacing", "star", -1.0), ("naive", "x", -0.5)):
            fig.add_trace(
                go.Scatter(
                    x=[x],
                    y=[per[name].utility],
                    mode="markers",
                    marker={"symbol": symbol, "size": 12},
                    name=f"{tenant} {name}",
                ),
                row=3,
                col=1,
            )
    fig.add_hline(y=1.0, line_dash="dot", row=1, col=1)
    fig.update_xaxes(title_text="virtual seconds", row=1, col=1)
    fig.update_xaxes(title_text="virtual seconds", row=2, col=1)
    fig.update_xaxes(title_text="fixed multiplier mu", row=3, col=1)
    fig.update_yaxes(title_text="spend / budget", row=1, col=1)
    fig.update_yaxes(title_text="mu", row=2, col=1)
    fig.update_yaxes(title_text="utility, $", row=3, col=1)
    fig.update_layout(height=1100, title="Autobidder pacing on the simulated engine")
    html = fig.to_html(include_plotlyjs=True, full_html=True)
    table_html = "<pre>" + table(rows) + "</pre>"
    with open(path, "w") as f:
        f.write(html.replace("<body>", "<body>" + table_html, 1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4096, help="requests in a run")
    parser.add_argument("--rate", type=float, default=25.0, help="arrivals per second")
    parser.add_argument("--seeds", type=int, default=3, help="runs to average over")
    parser.add_argument("--json", help="write the evaluation to this file")
    parser.add_argument("--html", help="write a Plotly report to this file")
    args = parser.parse_args(argv)
    total = args.seeds * (1 + len(TENANTS) * (3 + len(MU_GRID)))
    bar = Progress(total, enabled=True)

    def progress(msg: str) -> None:
        bar.set_label(msg)
        bar.advance()

    evaluation = evaluate(
        requests=args.requests, load_rps=args.rate, seeds=args.seeds, progress=progress
    )
    rows = summary_rows(evaluation)
    print(table(rows))
    if args.json:
        out = {
            "budgets": evaluation["budgets"],
            "rows": rows,
            "results": {
                t: {name: vars(r) for name, r in per.items()}
                for t, per in evaluation["results"].items()
            },
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    if args.html:
        write_html(evaluation, rows, args.html)
    return 0


if __name__ == "__main__":
    sys.exit(main())
