"""Does the automatic reserve bring the priority wait to its target? The simulated engine serves
a Poisson load with a spread of bids in virtual time, and every ``--interval`` seconds the
reserve takes one step of the market's rule (``mechanism.reserve.reserve_step``, quantized as
``market.reserves`` quantizes it) from the TTFT p90 of the requests finished in the interval
whose bids bought priority.

    python -m benchmarks.auto_reserve [--load 1.3] [--target 1.0] [--interval 2] \\
        [--requests 16000] [--prompt 512] [--output 32] [--start 0.001] [--seed 1] \\
        [--json var/bench/auto_reserve.json] [--html var/bench/auto_reserve.html]

The load is above the engine's capacity, so a reserve nobody moves lets the priority wait grow;
the bids are lognormal with a median of 0.01 $/s (the 95th percentile bids 27 times the 5th),
so the reserve has a spread of bids to sort.

The same arrivals are also served with the reserve held at ``--start`` (the baseline: a
reserve nobody moves). The table gives, per interval, the reserve in force, the priority wait
measured and how many requests bought priority; the summary compares the two runs over the
second half of the intervals (once the automatic reserve has had time to walk): the median
priority wait against the target, and the share of intervals within 25% of it.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from accounts.money import money
from benchmarks.bids import BidSpec
from benchmarks.html import Section, Table, command_line, write_json, write_page
from benchmarks.runner import Capacities
from benchmarks.workloads import nosharing
from engines.contract.knobs import MarketKnobs
from engines.sim import Engine, EngineConfig, SimRequest
from engines.sim.driver import ArrivalQueue, run_virtual
from engines.sim.engine import StepResult
from mechanism import DEFAULT_POLICY
from mechanism.reserve import Finished, reserve_step

POLICY = DEFAULT_POLICY  # the product's default (a test holds market.models to it)
CEILING = 1.0  # $/s: market.models.DEFAULT_RESERVE_MAX
NEAR = 0.25  # an interval is "near the target" within 25% of it


@dataclass(frozen=True)
class Interval:
    """One interval: when it ended (virtual seconds), the reserve in force during it ($/s),
    the priority wait measured (TTFT p90, seconds; None: none bought priority), how many
    requests bought priority of those finished, and the reserve set for the next one."""

    end_s: float
    reserve: float
    wait_s: float | None
    priority: int
    served: int
    next_reserve: float


def quantized(reserve: float) -> float:
    """The reserve as the market stores it: the money's rounding rule (9 places)."""
    return float(money(reserve))


def serve(
    requests: list[SimRequest], *, start: float, target_s: float, interval_s: float, auto: bool
) -> list[Interval]:
    """Serve ``requests`` (in virtual time), stepping the reserve every ``interval_s`` when
    ``auto``, else holding it at ``start``; the intervals as measured."""
    engine = Engine(
        EngineConfig(), POLICY, knobs=replace(MarketKnobs(reserve=start), book_interval_s=None)
    )
    queue = ArrivalQueue([replace(r) for r in requests])
    last_arrival = max(r.arrival for r in requests)
    finished: list[Finished] = []
    intervals: list[Interval] = []
    next_step = interval_s

    def stepped(result: StepResult) -> None:
        nonlocal next_step
        while result.end >= next_step and next_step <= last_arrival:
            reserve = engine.reserve
            step = reserve_step(reserve, finished, target_s=target_s, ceiling=CEILING)
            new = quantized(step.reserve) if auto else reserve
            intervals.append(
                Interval(next_step, reserve, step.wait_s, step.priority, step.served, new)
            )
            engine.set_reserve(new)
            finished.clear()
            next_step += interval_s

    def done(req: SimRequest) -> None:
        assert req.first_token_at is not None
        finished.append(Finished(bid=req.bid, ttft_s=req.first_token_at - req.arrival))

    run_virtual(engine, queue, on_step=stepped, on_finished=done)
    return intervals


@dataclass(frozen=True)
class Summary:
    """Over the second half of a run's intervals: the median priority wait (seconds), the
    share of intervals within ``NEAR`` of the target, the median reserve ($/s), the median
    share of finished requests that bought priority."""

    run: str
    median_wait_s: float
    near_target: float
    median_reserve: float
    priority_share: float


def summary(run: str, intervals: list[Interval], target_s: float) -> Summary:
    """``run``'s :class:`Summary` over the second half of its ``intervals``."""
    late = intervals[len(intervals) // 2 :]
    waits = [i.wait_s for i in late if i.wait_s is not None]
    near = sum(1 for w in waits if abs(w - target_s) <= NEAR * target_s)
    shares = [i.priority / i.served for i in late if i.served]
    return Summary(
        run=run,
        median_wait_s=statistics.median(waits) if waits else math.nan,
        near_target=near / len(late) if late else math.nan,
        median_reserve=statistics.median(i.reserve for i in late) if late else math.nan,
        priority_share=statistics.median(shares) if shares else math.nan,
    )


def figure(auto: list[Interval], fixed: list[Interval], target_s: float) -> go.Figure:
    """The priority wait per interval (both runs) against the target, and the reserve."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    for name, run, color in (("automatic reserve", auto, "#2f6fed"), ("fixed", fixed, "#999")):
        fig.add_scatter(x=[i.end_s for i in run], y=[i.wait_s for i in run], mode="lines",
                        name=f"TTFT p90, {name} (s)", line={"color": color},
                        row=1, col=1)  # fmt: skip
    ends = [i.end_s for i in auto]
    fig.add_scatter(x=[ends[0], ends[-1]], y=[target_s, target_s], mode="lines",
                    name="target (s)", line={"dash": "dash", "color": "#c93c3c"},
                    row=1, col=1)  # fmt: skip
    fig.add_scatter(x=ends, y=[i.reserve for i in auto], mode="lines",
                    name="reserve, automatic ($/s)", line={"color": "#e08a2e", "shape": "hv"},
                    row=2, col=1)  # fmt: skip
    fig.update_yaxes(title_text="priority TTFT p90 (s)", row=1, col=1)
    fig.update_yaxes(title_text="reserve ($/s)", type="log", row=2, col=1)
    fig.update_xaxes(title_text="virtual time (s)", row=2, col=1)
    fig.update_layout(title="Automatic reserve: the priority wait against its target", height=640)
    return fig


def _seconds(value: float | None) -> str:
    """Seconds with their unit ("-" when unknown)."""
    return "-" if value is None or math.isnan(value) else f"{value:.2f} s"


def text(auto: list[Interval], summaries: list[Summary], target_s: float, every: int) -> str:
    """The summary of both runs, then the automatic run's intervals (one in ``every``)."""
    runs = Table(
        ("run", "median p90 wait", "near target", "median reserve", "bought priority"),
        [(s.run, _seconds(s.median_wait_s), f"{s.near_target:.0%}",
          f"{s.median_reserve:.6f} $/s", f"{s.priority_share:.0%}") for s in summaries],
    )  # fmt: skip
    intervals = Table(
        ("end", "reserve", "p90 wait", "priority/served"),
        [(f"{i.end_s:.0f} s", f"{i.reserve:.6f} $/s", _seconds(i.wait_s),
          f"{i.priority}/{i.served}") for i in auto[::every]],
    )  # fmt: skip
    shown = "every interval" if every == 1 else f"one interval in {every}"
    return (
        f"{runs.text()}\n\ntarget: TTFT p90 <= {target_s:g} s; the automatic run, {shown}:\n"
        + intervals.text()
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--load", type=float, default=1.3, help="x the engine's capacity (1.3)")
    p.add_argument("--target", type=float, default=1.0, metavar="SECONDS", help="TTFT p90 (1)")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="(2)")
    p.add_argument("--requests", type=int, default=16000, help="(16000)")
    p.add_argument("--start", type=float, default=0.001, metavar="$/s", help="reserve (0.001)")
    p.add_argument("--prompt", type=int, default=512, metavar="TOKENS", help="(512)")
    p.add_argument("--output", type=int, default=32, metavar="TOKENS", help="mean (32)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path)
    p.add_argument("--html", type=Path)
    opts = p.parse_args(argv)
    bids = BidSpec("lognormal", mu=math.log(0.01), sigma=1.0)  # median 0.01 $/s
    workload = nosharing(
        num_requests=opts.requests, prompt_len=opts.prompt, output_len=opts.output, bids=bids,
        seed=opts.seed,
    )  # fmt: skip
    config = EngineConfig()
    rate = opts.load * Capacities().get(workload, config)
    timed = workload.at_rate(rate, opts.seed)
    # Output lengths spread uniformly over 1 .. 2 x --output - 1 (mean --output): requests of one
    # length admitted together would all finish in the same step, and the wait read per
    # interval would come in waves.
    lengths = random.Random(f"{opts.seed}:lengths")
    requests = [
        SimRequest(r.id, r.tokens, lengths.randint(1, 2 * opts.output - 1), r.bid, r.arrival)
        for r in timed.requests
    ]
    runs = {
        name: serve(requests, start=opts.start, target_s=opts.target, interval_s=opts.interval,
                    auto=auto)
        for name, auto in (("automatic", True), ("fixed", False))
    }  # fmt: skip
    summaries = [summary(name, run, opts.target) for name, run in runs.items()]
    every = max(1, len(runs["automatic"]) // 40)
    report = text(runs["automatic"], summaries, opts.target, every)
    print(f"{workload.title}; load {opts.load:g} x capacity ({rate:.2f} requests/s)\n")
    print(report)
    if opts.json:
        doc = {
            "load": opts.load,
            "rate_rps": rate,
            "target_s": opts.target,
            "interval_s": opts.interval,
            "summary": [asdict(s) for s in summaries],
            "intervals": {name: [asdict(i) for i in run] for name, run in runs.items()},
        }
        write_json(opts.json, doc)
    if opts.html:
        write_page(
            opts.html,
            "Automatic reserve",
            [Section("", report, figures=[figure(runs["automatic"], runs["fixed"], opts.target)])],
            command=command_line("benchmarks.auto_reserve", argv),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
