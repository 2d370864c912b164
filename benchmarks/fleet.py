"""A fleet of 8 to 32 replicas behind SGLang's model gateway (smg), against one queue.

    python -m benchmarks.fleet [--replicas 8 16 32] [--workloads gsp chat] \\
        [--routings cache_aware round_robin prefix_hash] [--gateways 1 2] [--load 1.5] \\
        [--engine-policies dfs-auction-density lpm highest-bid] [--engine-rps 2] \\
        [--processes 2] [--groups 256] [--per-group 2] [--trace FILE] \\
        [--json var/bench/fleet.json] [--html var/bench/fleet.html]

For each workload and number of replicas N, in real time: N simulated engines (DFS auction
``dfs-auction-density``), served by ``--processes`` processes (``engines.sim.many``: each engine
its own server on its own port, so smg sees N workers), smg in front (``engines.router``;
``--gateways 2``: two smg instances in front of the same replicas, the requests dealt between
them in turn, as a deployment with two entry points runs), and Poisson arrivals sent as token
ids with each bid in ``sampling_params.custom_params``. A routing is one of smg's policies with
the market's settings (``engines.router.RouterOptions``), or ``ROUTINGS``'s named variants.

The baselines of the same run, on the same arrivals: one engine N times as fast and as large
(``benchmarks.replicas.scaled``). The one queue and every routing run their engines three
times (``--engine-policies``), ordering the queues by the DFS auction, by ``lpm`` (bid-blind)
and by ``highest-bid`` (the unconstrained priority order). So per routing:

- ``capture``: the policy benchmark's (``benchmarks.goal.capture``), within that setup:
  (welfare(auction) - welfare(lpm)) / (welfare(highest-bid) - welfare(lpm));
- ``kept``: the fleet's capture over the one queue's, the share of the one queue's welfare gain
  the fleet keeps (not its welfare over the one queue's: N engines each N times slower make
  every request wait longer, whatever the routing);
- the cache hit rate (cached over prompt tokens, all engines), mean and p99 TTFT, welfare
  (-sum bid x TTFT, $), and the urgent (high-bid) and background classes' mean TTFT.

Load is a fraction of the fleet's capacity (N x one engine's, measured in virtual time with
every request queued at once under the DFS auction, as the replicas benchmark measures it).
The engines run at ``--engine-rps`` requests per wall second each; every time is in engine
seconds. Workloads: ``gsp`` (SGLang's generated shared prefix: ``--groups`` system prompts,
Zipf-popular), ``chat`` (``--groups`` conversations under one short system prompt, heavy-tailed
lengths; a conversation's turns extend each other), ``trace`` (``--trace FILE``, replayed at
its own times, benchmarks/trace.py).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from plotly.subplots import make_subplots

from engines.client.answers import generate_body, meta_parsed
from engines.router import Router, RouterOptions, free_ports, http_wait
from engines.sim import EngineConfig

from .gateway import start, stop
from .goal import BASE, UNCONSTRAINED, capture
from .html import Section, Table, command_line, write_json, write_page
from .live import admitted
from .metrics import Served, mean, percentile, summarize
from .progress import Progress
from .replicas import ENGINE_POLICY, Started, config_settings, engine_cache_counts, scaled
from .runner import simulate, steady_throughput
from .trace import load_trace
from .workloads import BenchRequest, Workload, chat, gsp

ONE_QUEUE = "one queue"  # the baselines' routing name
# Routings beyond smg's policies with the market's settings: name -> (policy, RouterOptions).
ROUTINGS: dict[str, tuple[str, dict[str, float | int | bool]]] = {
    "cache_aware": ("cache_aware", {}),
    "round_robin": ("round_robin", {}),
    "power_of_two": ("power_of_two", {}),
    "prefix_hash": ("prefix_hash", {}),
    "consistent_hashing": ("consistent_hashing", {}),
    # cache-aware with smg's own defaults (its worker-overload protection on)
    "cache_aware/smg": ("cache_aware", {"worker_overload_protection": True}),
    # prefix_hash that moves a request off its prefix's replica as soon as that replica's
    # requests in flight are above the mean (smg's: above 1.25 x the mean and the mean + 10)
    "prefix_hash/balanced": (
        "prefix_hash",
        {"prefix_hash_balance_abs_threshold": 0, "prefix_hash_load_factor": 1.0},
    ),
}
BASELINES = (ENGINE_POLICY, BASE, UNCONSTRAINED)
ENGINES_START_S = 60.0


def workload_of(args: argparse.Namespace, name: str) -> Workload:
    """The named workload, its arrivals all at 0 (a trace keeps its own)."""
    if name == "gsp":
        return gsp(
            num_groups=args.groups, prompts_per_group=args.per_group, system_prompt_len=512,
            question_len=64, output_len=16, popularity="zipf", seed=args.seed,
        )  # fmt: skip
    if name == "chat":
        return chat(
            num_requests=args.groups * args.per_group, conversations=args.groups,
            system_prompt_len=64, median_len=384, output_len=16, seed=args.seed,
        )  # fmt: skip
    if name == "trace":
        if args.trace is None:
            raise SystemExit("--workloads trace needs --trace FILE")
        return load_trace(args.trace, seed=args.seed)
    raise SystemExit(f"unknown workload {name!r}")


def capacity_rps(workload: Workload, config: EngineConfig) -> float:
    """One engine's capacity on ``workload``, requests per engine second (virtual time, every
    request queued at once, under the DFS auction)."""
    run = simulate(workload.all_at_once(), ENGINE_POLICY, config)
    return steady_throughput([r.arrival + r.e2e_s for r in run.served], run.makespan_s)


@dataclass
class Engines(Started):
    """``len(configs)`` simulated engines over ``processes`` processes, and ``gateways`` smg
    instances in front of them (none: the engines are reached directly)."""

    configs: list[EngineConfig]
    policy: str
    speed: float
    work: Path
    processes: int
    gateways: int
    router_kwargs: dict[str, Any] = field(default_factory=dict)
    urls: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    routers: list[Router] = field(default_factory=list)

    def _start(self) -> Engines:
        n = len(self.configs)
        ports = free_ports(n + 2 * self.gateways)
        engine_ports, gateway_ports = ports[:n], ports[n:]
        self.urls = [f"http://127.0.0.1:{p}" for p in engine_ports]
        # Engines of one process share their settings: the fleet's are all alike, the one
        # queue is one engine.
        per = math.ceil(n / min(self.processes, n))
        for first in range(0, n, per):
            argv = [
                sys.executable, "-m", "engines.sim.many", "--first-index", str(first),
                "--rounds-dir", str(self.work), "--policy", self.policy,
                "--speed", str(self.speed), "--log-level", "WARNING", "--max-queue", "100000",
            ]  # fmt: skip
            for port in engine_ports[first : first + per]:
                argv += ["--port", str(port)]
            for setting in config_settings(self.configs[first]):
                argv += ["--set", setting]
            self.procs.append(start(argv))
        deadline = time.monotonic() + ENGINES_START_S
        for i, url in enumerate(self.urls):
            proc = self.procs[i // per]
            http_wait(f"{url}/health", proc, timeout_s=max(1.0, deadline - time.monotonic()))
        for g in range(self.gateways if self.router_kwargs else 0):
            options = RouterOptions(
                port=gateway_ports[2 * g], prometheus_port=gateway_ports[2 * g + 1],
                worker_urls=tuple(self.urls), **self.router_kwargs,
            )  # fmt: skip
            self.routers.append(Router(options).start(timeout_s=120.0))
        return self

    @property
    def entry_urls(self) -> list[str]:
        return [r.url for r in self.routers] or self.urls[:1]

    def __exit__(self, *exc: object) -> None:
        for router in self.routers:
            router.stop()
        for proc in self.procs:
            stop(proc)

    def requests_per_engine(self) -> list[int]:
        """How many requests each engine admitted (its round records)."""
        return [len(admitted(self.work / f"rep-{i}.jsonl")) for i in range(len(self.urls))]

    def cache_counts(self) -> tuple[float, float]:
        """(cached, prompt) tokens over every engine (their ``/metrics``)."""
        counts = [engine_cache_counts(url) for url in self.urls]
        return sum(c for c, _ in counts), sum(p for _, p in counts)


async def drive(
    entries: list[str], reqs: Sequence[BenchRequest], speed: float, progress: Progress
) -> tuple[list[Served], int]:
    """Send each request at its arrival (engine seconds / ``speed`` of wall time), request
    ``i`` to ``entries[i % len(entries)]``; the served and the number that failed."""
    served: list[Served] = []
    failed = 0
    began = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:

        async def one(i: int, r: BenchRequest) -> None:
            nonlocal failed
            await asyncio.sleep(max(0.0, began + r.arrival / speed - time.monotonic()))
            body = generate_body(
                rid=r.id, max_new_tokens=r.max_new_tokens, bid=r.bid, input_ids=list(r.tokens)
            )
            url = entries[i % len(entries)] + "/generate"
            try:
                async with session.post(url, json=body) as answer:
                    data = await answer.json() if answer.status == 200 else None
                meta = meta_parsed(data) if data else None
            except (TimeoutError, aiohttp.ClientError, ValueError, TypeError):
                meta = None
            if meta is None:
                failed += 1
            else:
                e2e = meta.raw.get("e2e_latency")
                served.append(
                    Served(r.id, r.bid, r.bid_class, r.arrival, meta.ttft_s or 0.0,
                           e2e if isinstance(e2e, float) else math.nan, meta.charge or 0.0)
                )  # fmt: skip
            progress.advance()

        await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))
    return served, failed


@dataclass(frozen=True)
class Setup:
    """One run: ``replicas`` engines under ``routing`` (or the one queue ordered by
    ``engine_policy``), behind ``gateways`` smg instances."""

    workload: str
    replicas: int
    routing: str
    engine_policy: str = ENGINE_POLICY
    gateways: int = 1

    @property
    def name(self) -> str:
        if self.routing == ONE_QUEUE:
            return ONE_QUEUE
        return self.routing + (f" x{self.gateways} gateways" if self.gateways > 1 else "")


def run_setup(
    setup: Setup,
    reqs: Sequence[BenchRequest],
    config: EngineConfig,
    speed: float,
    processes: int,
    progress: Progress,
) -> dict[str, Any]:
    """One setup, start to end: its row."""
    single = setup.routing == ONE_QUEUE
    configs = [scaled(config, setup.replicas)] if single else [config] * setup.replicas
    router = {}
    if not single:
        routing_policy, options = ROUTINGS[setup.routing]
        router = {"policy": routing_policy, **options}
    progress.set_label(f"{setup.workload} {setup.replicas}x {setup.name} {setup.engine_policy}")
    with (
        tempfile.TemporaryDirectory() as work,
        Engines(
            configs,
            setup.engine_policy,
            speed,
            Path(work),
            1 if single else processes,
            setup.gateways,
            router,
        ) as engines,  # fmt: skip
    ):
        wall = time.monotonic()
        served, failed = asyncio.run(drive(engines.entry_urls, reqs, speed, progress))
        wall = time.monotonic() - wall
        time.sleep(0.3)  # the last round records reach their files
        cached, prompt = engines.cache_counts()
        spread = engines.requests_per_engine()
    row = summary(served, cached, prompt)
    return {
        **asdict(setup),
        "name": setup.name,
        "failed": failed,
        "wall_s": wall,
        "requests_per_engine": spread,
        **row,
    }


def summary(served: list[Served], cached: float, prompt: float) -> dict[str, Any]:
    """A run's figures: hit rate, TTFT (engine s), welfare ($), per class mean TTFT."""
    if not served:
        return {"requests": 0}
    makespan = max(s.arrival + s.e2e_s for s in served) - min(s.arrival for s in served)
    m = summarize(served, makespan_s=makespan, tokens=int(prompt),
                  cache_hit_rate=cached / prompt if prompt else math.nan)  # fmt: skip
    classes = {
        cls: [s.ttft_s for s in served if s.bid_class == cls] for cls in ("urgent", "background")
    }
    return {
        "requests": len(served),
        "cache_hit_rate": m.cache_hit_rate,
        "mean_ttft_s": m.mean_ttft_s,
        "p99_ttft_s": m.p99_ttft_s,
        "welfare": m.welfare,
        "revenue": m.revenue,
        "urgent_mean_ttft_s": mean(classes["urgent"]),
        "background_mean_ttft_s": mean(classes["background"]),
        "urgent_p99_ttft_s": percentile(classes["urgent"], 99),
    }


def with_gains(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each auction row with ``capture`` (against the lpm and highest-bid rows of its own
    workload, replicas and routing) and ``kept`` (its capture over the one queue's)."""
    runs = {
        (r["workload"], r["replicas"], r["name"], r["engine_policy"]): r
        for r in rows
        if r.get("requests")
    }
    captures = {}
    for (w, n, name, policy), r in runs.items():
        base, top = runs.get((w, n, name, BASE)), runs.get((w, n, name, UNCONSTRAINED))
        if policy == ENGINE_POLICY and base and top:
            captures[(w, n, name)] = capture(r["welfare"], base["welfare"], top["welfare"])
    out = []
    for r in rows:
        key = (r["workload"], r["replicas"], r["name"])
        own = captures.get(key, math.nan)
        one = captures.get((r["workload"], r["replicas"], ONE_QUEUE), math.nan)
        kept = own / one if one > 0 else math.nan
        out.append({**r, "capture": own, "kept": kept})
    return out


def table(rows: list[dict[str, Any]]) -> Table:
    """A row per workload, replicas and routing: hit rate, TTFT, welfare, the gain kept."""
    columns = (
        "workload", "replicas", "routing", "hit", "mean TTFT s", "p99 TTFT s", "welfare $",
        "capture", "kept", "urgent TTFT s", "background TTFT s", "max/mean requests",
    )  # fmt: skip
    lines = []
    for r in rows:
        if not r.get("requests") or r["engine_policy"] != ENGINE_POLICY:
            continue
        spread = r.get("requests_per_engine") or []
        balance = (
            f"{max(spread) / mean(spread):.2f}" if len(spread) > 1 and mean(spread) > 0 else ""
        )
        lines.append((
            r["workload"], str(r["replicas"]), r["name"], f"{r['cache_hit_rate']:.3f}",
            f"{r['mean_ttft_s']:.3f}", f"{r['p99_ttft_s']:.3f}", f"{r['welfare']:.2f}",
            _share(r["capture"]), _share(r["kept"]), f"{r['urgent_mean_ttft_s']:.3f}",
            f"{r['background_mean_ttft_s']:.3f}", balance,
        ))  # fmt: skip
    return Table(columns, lines)


def seeds_table(parts: Sequence[tuple[str, list[dict[str, Any]]]]) -> Table:
    """The routings that several runs all measured (``parts``: a label, say the seed, and the
    rows of one ``--json``): a row per workload, replicas, routing and run, then two rows over
    the runs: the median of kept, and kept pooled (the sums of the gains over the runs in
    capture's ratio, so that a run whose gains are small weighs little). Each row: the hit rate,
    kept, and the welfare gains over lpm (dollars) of the auction and of highest-bid, in the
    fleet and in the one queue. Where the fleet's gains are small, its capture is a ratio of
    small differences of real-time runs: that is where "kept" swings from run to run."""
    columns = (
        "workload", "replicas", "routing", "run", "hit", "kept",
        "fleet: auction / highest-bid gain $", "one queue: auction / highest-bid gain $",
    )  # fmt: skip
    # (workload, replicas, routing) -> per run: label, hit, kept, and the welfare of the auction,
    # lpm and highest-bid in the fleet, then in the one queue
    runs: dict[tuple[str, int, str], list[tuple[str, float, float, tuple[float, ...]]]] = {}
    for label, rows in parts:
        by = {(r["workload"], r["replicas"], r["name"], r["engine_policy"]): r["welfare"]
              for r in rows if r.get("requests")}  # fmt: skip
        for r in rows:
            w, n, name = r["workload"], r["replicas"], r["name"]
            if r["engine_policy"] != ENGINE_POLICY or name == ONE_QUEUE or not r.get("requests"):
                continue
            try:
                welfare = tuple(
                    by[(w, n, setup, policy)]
                    for setup in (name, ONE_QUEUE)
                    for policy in (ENGINE_POLICY, BASE, UNCONSTRAINED)
                )
            except KeyError:  # a baseline missing from this run
                continue
            kept = math.nan if r["kept"] is None else r["kept"]
            runs.setdefault((w, n, name), []).append((label, r["cache_hit_rate"], kept, welfare))
    lines = []
    for (w, n, name), got in runs.items():
        if len(got) < len(parts):  # a routing only some of the runs measured
            continue
        for label, hit, kept, welfare in got:
            lines.append((w, str(n), name, label, f"{hit:.3f}", _share(kept), *_gains(welfare)))
        valued = [k for _, _, k, _ in got if not math.isnan(k)]
        median = (
            f"{statistics.median(valued):.2f} ({sum(k >= 0.9 for k in valued)} of {len(valued)}"
            " runs at 0.9 or more)"
            if valued
            else "n/a"
        )
        hit = statistics.median(h for _, h, _, _ in got)
        lines.append((w, str(n), name, f"median of {len(got)}", f"{hit:.3f}", median, "", ""))
        summed = tuple(math.fsum(welfare[i] for *_, welfare in got) for i in range(6))
        fleet, one = capture(*summed[:3]), capture(*summed[3:])
        pooled = fleet / one if one > 0 else math.nan
        lines.append((w, str(n), name, "pooled", "", _share(pooled), *_gains(summed)))
    return Table(columns, lines)


def _gains(welfare: Sequence[float]) -> tuple[str, str]:
    """The auction's and highest-bid's welfare gains over lpm, in the fleet and in the one
    queue (``welfare``: the auction's, lpm's and highest-bid's, the fleet's then the one
    queue's)."""
    auction, base, top, one_auction, one_base, one_top = welfare
    return (
        f"{auction - base:.2f} / {top - base:.2f}",
        f"{one_auction - one_base:.2f} / {one_top - one_base:.2f}",
    )


def _share(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.2f}"


def report_html(rows: list[dict[str, Any]], path: Path, title: str, command: str) -> None:
    """The table, and Plotly: per workload, the share of the gain kept and the hit rate
    against the number of replicas, a line per routing."""
    workloads = sorted({r["workload"] for r in rows})
    fig = make_subplots(
        rows=len(workloads), cols=3, shared_xaxes=True,
        subplot_titles=[
            f"{w}: {t}" for w in workloads
            for t in ("welfare gain kept (one queue = 1)", "cache hit rate", "mean TTFT (s)")
        ],
    )  # fmt: skip
    for i, w in enumerate(workloads, start=1):
        rows_w = [r for r in rows if r["workload"] == w and r["engine_policy"] == ENGINE_POLICY]
        names = sorted({r["name"] for r in rows_w})
        for name in names:
            part = sorted(
                (r for r in rows_w if r["name"] == name and r.get("requests")),
                key=lambda r: r["replicas"],
            )
            x = [r["replicas"] for r in part]
            for col, key in enumerate(("kept", "cache_hit_rate", "mean_ttft_s"), start=1):
                y = [None if r[key] is None or math.isnan(r[key]) else r[key] for r in part]
                fig.add_scatter(x=x, y=y, name=name, legendgroup=name, mode="lines+markers",
                                showlegend=(i, col) == (1, 1), row=i, col=col)  # fmt: skip
    fig.update_xaxes(title_text="replicas", type="log")
    fig.update_layout(height=360 * len(workloads))
    write_page(path, title, [Section("Fleet", table(rows).text(), figures=[fig])], command=command)


def plan(args: argparse.Namespace) -> list[Setup]:
    out = []
    for w in args.workloads:
        for n in args.replicas:
            out += [Setup(w, n, ONE_QUEUE, p) for p in args.engine_policies]
            out += [Setup(w, n, routing, p, g) for routing in args.routings
                    for g in args.gateways for p in args.engine_policies]  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__)
    p.add_argument("--replicas", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--workloads", nargs="+", default=["gsp", "chat"],
                   choices=["gsp", "chat", "trace"])  # fmt: skip
    p.add_argument("--routings", nargs="+", default=["cache_aware", "round_robin", "prefix_hash"],
                   choices=sorted(ROUTINGS))  # fmt: skip
    p.add_argument(
        "--engine-policies", nargs="+", default=list(BASELINES), choices=BASELINES,
        help="the engines' orders run for each routing (capture needs all three)",
    )  # fmt: skip
    p.add_argument("--gateways", type=int, nargs="+", default=[1], choices=[1, 2])
    p.add_argument("--groups", type=int, default=256, help="gsp's groups, chat's conversations")
    p.add_argument("--per-group", type=int, default=2, help="requests per group (mean)")
    p.add_argument("--trace", type=Path, default=None)
    p.add_argument("--load", type=float, default=1.5, help="x the fleet's capacity")
    p.add_argument(
        "--engine-rps",
        type=float,
        default=2.0,
        help="one engine's capacity in requests per wall second (sets the speed)",
    )
    p.add_argument("--processes", type=int, default=2, help="processes serving the engines")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=Path("var/bench/fleet.json"))
    p.add_argument("--html", type=Path, default=Path("var/bench/fleet.html"))
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.replicas) or not args.load > 0 or not args.engine_rps > 0:
        p.error("--replicas, --load and --engine-rps must be positive")
    # A KV cache that holds a few dozen of the system prompts, not all: where a prefix lands
    # matters.
    config = EngineConfig(kv_capacity_tokens=24_000, max_running_requests=64)
    setups = plan(args)
    workloads = {w: workload_of(args, w) for w in args.workloads}
    capacities = {w: capacity_rps(wl, config) for w, wl in workloads.items()}
    total = sum(len(workloads[s.workload].requests) for s in setups)
    progress = Progress(total, enabled=not args.no_progress)
    meta = {
        "command": command_line("benchmarks.fleet", argv),
        "workloads": {},
        "load": args.load,
        "engine_rps": args.engine_rps,
        "config": asdict(config),
        "cpu_count": os.cpu_count(),
    }
    rows: list[dict[str, Any]] = []
    for w, wl in workloads.items():
        speed = args.engine_rps / capacities[w]
        meta["workloads"][w] = {"title": wl.title, "capacity_rps": capacities[w], "speed": speed}
        print(f"{wl.title}: one engine {capacities[w]:.2f} requests per engine second, "
              f"speed {speed:.4g}", file=sys.stderr)  # fmt: skip
        for s in (s for s in setups if s.workload == w):
            rate = args.load * s.replicas * capacities[w]
            timed = wl if w == "trace" else wl.at_rate(rate, args.seed)
            rows.append(run_setup(s, timed.requests, config, speed, args.processes, progress))
            # Saved after every run: a long run interrupted keeps what it measured.
            write_json(args.json, {"meta": meta, "rows": with_gains(rows)})
    progress.close()
    rows = with_gains(rows)
    title = "A fleet behind SGLang's model gateway vs one queue of the same capacity"
    report_html(rows, args.html, title, meta["command"])
    print(table(rows).text())
    print(f"JSON: {args.json}  report: {args.html}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
