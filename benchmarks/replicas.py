"""Replicas behind SGLang's model gateway (smg), against one engine of the same total capacity.

    python -m benchmarks.replicas [--replicas 1 2 4] [--loads 0.8 1.0 1.2 1.5] \\
        [--policies cache_aware round_robin] [--variants smg open] [--requests 240] [--tune] \\
        [--json var/bench/replicas.json] [--html var/bench/replicas.html]

For each number of replicas N, gateway policy and load, in real time: N simulated engines
(``engines.sim.server``, DFS auction ``dfs-auction-density``, each writing its round records to
a file), the gateway in front of them (``engines.router``), and Poisson arrivals of a
shared-prefix workload sent as text (what the gateway's cache-aware tree matches) through the
project's engine client, each with its bid in ``sampling_params.custom_params``. With
``--variants``, cache-aware runs with other gateway settings too (``VARIANTS``: ``smg``, smg's
own defaults; ``open``, the balance gate opened, so that a prefix stays on the replica that has
it cached however loaded). The baseline of the same run is one engine N times as fast (every
per-token and per-step cost divided by N, its KV cache and running-request limit multiplied by
N), fed the same arrivals directly: what a bid buys when it competes in one queue instead of in
the queue the gateway chose.

Load is a fraction of the fleet's capacity: N x one engine's capacity on the workload, measured
in virtual time with every request queued at once under the engines' DFS auction (the policy
benchmark measures it under fcfs, which thrashes this workload's KV cache: a third of it).
The engines run at ``--speed`` engine seconds per wall second, chosen so that one engine serves
about ``--engine-rps`` requests per wall second; every figure is in engine seconds (TTFT as the
engine reports it, arrival to first token), so runs at other speeds compare.

Per setup: cache hit (cached over prompt tokens), mean and p99 TTFT, realized welfare
(-sum bid x TTFT, dollars: closer to 0 is better) and revenue (priority charges, dollars),
merged and per replica (a request's replica from the round records). ``--tune`` adds cache-aware
runs at one load with other cache and balance thresholds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from plotly.subplots import make_subplots
from prometheus_client.parser import text_string_to_metric_families

from engines.client import EngineClient, EngineError, generate_body
from engines.contract.tokenizer import Tokenizer
from engines.router import Router, RouterOptions, free_ports, http_wait
from engines.sim import EngineConfig
from mechanism import POLICIES

from .bids import BidSpec
from .gateway import start, stop
from .html import Section, Table, command_line, write_page
from .live import admitted
from .metrics import Served, mean, ratio, summarize
from .progress import Progress
from .runner import simulate, steady_throughput
from .workloads import BenchRequest, Workload

ENGINE_POLICY = "dfs-auction-density"
SINGLE = "one engine"  # the baseline's name where a gateway policy would be
# Cache-aware gateway settings other than smg's defaults, by name (``--variants``): RouterOptions.
# Plain ``cache_aware`` runs the market's settings (engines.router: smg's balance gate, its
# worker-overload protection off). "smg": smg's own defaults, the protection on; "open": the
# balance gate opened too, so that a prefix stays on the replica that has it cached however
# loaded; "open-gate": the gate opened, the protection on.
OPEN_GATE: dict[str, float | bool] = {
    "balance_abs_threshold": 100_000,
    "balance_rel_threshold": 1000.0,
}
VARIANTS: dict[str, dict[str, float | bool]] = {
    "smg": {"worker_overload_protection": True},
    "open": {**OPEN_GATE, "worker_overload_protection": False},
    "open-gate": {**OPEN_GATE, "worker_overload_protection": True},
}


# A row's figures from metrics.summarize (PolicyMetrics fields), in the JSON's order.
ROW_METRICS = ("cache_hit_rate", "mean_ttft_s", "p99_ttft_s", "welfare", "revenue")


@dataclass(frozen=True)
class TextRequest:
    """One request of the workload: its text, what it asks, its bid ($/s), its arrival (s)."""

    id: str
    text: str
    max_new_tokens: int
    bid: float
    bid_class: str
    arrival: float = 0.0


def shared_prefix_workload(
    *,
    groups: int,
    requests: int,
    system_words: int,
    question_words: int,
    output_len: int,
    seed: int,
) -> list[TextRequest]:
    """``requests`` requests, each one of ``groups`` system prompts (Zipf-popular, s = 1) and a
    question of its own, as words the simulated engine's tokenizer splits at the spaces (two
    tokens a word), with two-class bids."""
    rng = random.Random(f"{seed}:replicas")
    systems = [
        " ".join(f"s{g}w{rng.randrange(10**6)}" for _ in range(system_words)) for g in range(groups)
    ]
    weights = [1.0 / (rank + 1) for rank in range(groups)]
    bids = BidSpec()
    out = []
    for i in range(requests):
        g = rng.choices(range(groups), weights=weights)[0]
        question = " ".join(f"q{rng.randrange(10**6)}" for _ in range(question_words))
        bid, cls = bids.draw(rng)
        out.append(TextRequest(f"g{g}-r{i}", f"{systems[g]} {question}", output_len, bid, cls))
    return out


def with_arrivals(reqs: list[TextRequest], rate_rps: float, seed: int) -> list[TextRequest]:
    """Poisson arrivals at ``rate_rps`` (engine seconds)."""
    rng = random.Random(f"{seed}:arrivals:{rate_rps}")
    t, out = 0.0, []
    for r in reqs:
        t += rng.expovariate(rate_rps)
        out.append(replace(r, arrival=t))
    return out


def engine_capacity_rps(reqs: list[TextRequest], config: EngineConfig) -> float:
    """One engine's capacity on the workload (requests per engine second, virtual time): every
    request queued at once under the engine's own policy, the steady middle half of the finish
    times (``runner.steady_throughput``). Not under fcfs, as the policy benchmark measures it:
    fcfs interleaves the groups and thrashes this KV cache, for a third of the throughput."""
    tokenizer = Tokenizer()  # not the process's shared one: its pieces would leak into decoding
    bench = tuple(
        BenchRequest(r.id, tuple(tokenizer.encode(r.text)), r.max_new_tokens, r.bid, r.bid_class)
        for r in reqs
    )
    workload = Workload("replicas", f"replicas:{len(bench)}", bench)
    run = simulate(workload.all_at_once(), ENGINE_POLICY, config)
    return steady_throughput([r.arrival + r.e2e_s for r in run.served], run.makespan_s)


def scaled(config: EngineConfig, n: int) -> EngineConfig:
    """An engine ``n`` times as fast and as large as ``config``."""
    costs = ("step_fixed_s", "prefill_token_s", "prefill_attention_s", "decode_seq_s",
             "decode_context_token_s")  # fmt: skip
    sizes = ("kv_capacity_tokens", "max_running_requests", "max_prefill_tokens")
    faster = {name: getattr(config, name) / n for name in costs}
    return replace(config, **faster, **{name: getattr(config, name) * n for name in sizes})


def config_settings(config: EngineConfig) -> list[str]:
    """``--set`` arguments that give an engine ``config``."""
    base = EngineConfig()
    return [
        f"{name}={value}" for name, value in asdict(config).items() if value != getattr(base, name)
    ]


@dataclass
class Setup:
    """One run: ``replicas`` engines behind the gateway under ``policy`` (or ``SINGLE``), with
    the gateway settings ``thresholds`` (a ``VARIANTS`` entry when ``variant`` names one)."""

    replicas: int
    policy: str
    load: float
    thresholds: dict[str, float | bool] = field(default_factory=dict)
    variant: str = ""

    @property
    def label(self) -> str:
        name = setup_name(self.policy, self.variant, self.thresholds)
        return f"{self.replicas}x {name} @ {self.load:g}"


def setup_name(policy: str, variant: str, thresholds: dict[str, float | bool]) -> str:
    """A setup's name in tables and charts: its policy, and its variant or its thresholds."""
    if variant:
        return f"{policy}/{variant}"
    return policy + "".join(f" {k}={v:g}" for k, v in thresholds.items())


class Started:
    """A context manager whose ``_start`` starts processes: on a failed start, what it had
    started is stopped (``__exit__``) before the error goes on."""

    def __enter__(self):  # type: ignore[no-untyped-def]
        try:
            return self._start()
        except BaseException:
            self.__exit__()
            raise

    def _start(self):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def __exit__(self, *exc: object) -> None:
        raise NotImplementedError


def engine_cache_counts(url: str) -> tuple[float, float]:
    """An engine's (cached, prompt) tokens so far, from its ``/metrics``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    families = text_string_to_metric_families(text)
    values = {sample.name: sample.value for f in families for sample in f.samples}
    return (
        values.get("sglang:cached_tokens_total", 0.0),
        values.get("sglang:prompt_tokens_total", 0.0),
    )


@dataclass
class Fleet(Started):
    """Engines as child processes (and the gateway in front of them, with ``router_kwargs``:
    RouterOptions; None for one engine alone)."""

    configs: list[EngineConfig]
    speed: float
    work: Path
    router_kwargs: dict | None
    policy: str = ENGINE_POLICY
    engines: list[tuple[str, str, Path, subprocess.Popen[bytes]]] = field(default_factory=list)
    router: Router | None = None

    def _start(self) -> Fleet:
        *ports, router_port, metrics_port = free_ports(len(self.configs) + 2)
        for i, (config, port) in enumerate(zip(self.configs, ports, strict=True)):
            engine_id = f"rep-{i}"
            rounds = self.work / f"{engine_id}.jsonl"
            argv = [
                sys.executable, "-m", "engines.sim.server", "--port", str(port),
                "--policy", self.policy, "--speed", str(self.speed), "--engine-id", engine_id,
                "--rounds-jsonl", str(rounds), "--log-level", "WARNING", "--max-queue", "100000",
            ]  # fmt: skip
            for setting in config_settings(config):
                argv += ["--set", setting]
            self.engines.append((engine_id, f"http://127.0.0.1:{port}", rounds, start(argv)))
        for _, url, _, proc in self.engines:
            http_wait(f"{url}/health", proc, timeout_s=30.0)
        if self.router_kwargs is not None:
            options = RouterOptions(
                port=router_port, prometheus_port=metrics_port,
                worker_urls=tuple(u for _, u, _, _ in self.engines),
                **self.router_kwargs,
            )  # fmt: skip
            self.router = Router(options).start()
        return self

    @property
    def url(self) -> str:
        return self.router.url if self.router is not None else self.engines[0][1]

    def __exit__(self, *exc: object) -> None:
        if self.router is not None:
            self.router.stop()
        for *_, proc in self.engines:
            stop(proc)

    def replica_of(self) -> dict[str, str]:
        """Request id -> the engine id that admitted it (from the round records)."""
        return {
            a["request_id"]: engine_id
            for engine_id, _, rounds, _ in self.engines
            for a in admitted(rounds)
        }

    def cache_counts(self) -> dict[str, tuple[float, float]]:
        """Engine id -> (cached, prompt) tokens from its ``/metrics``."""
        return {engine_id: engine_cache_counts(url) for engine_id, url, _, _ in self.engines}


async def drive(
    url: str, reqs: list[TextRequest], speed: float, progress: Progress
) -> tuple[list[Served], int, int]:
    """Send each request at its arrival (engine seconds / ``speed`` of wall time); the served,
    the completion tokens and the failures."""
    client = EngineClient(answer_timeout_s=3600)
    served: list[Served] = []
    completion = 0
    failed = 0
    start = time.monotonic()

    async def one(r: TextRequest) -> None:
        nonlocal completion, failed
        await asyncio.sleep(max(0.0, start + r.arrival / speed - time.monotonic()))
        body = generate_body(rid=r.id, max_new_tokens=r.max_new_tokens, bid=r.bid, text=r.text)
        try:
            out = await client.generate(base_url=url, body=body)
        except EngineError:
            failed += 1
        else:
            meta = out.meta
            e2e = meta.raw.get("e2e_latency")
            served.append(
                Served(r.id, r.bid, r.bid_class, r.arrival, meta.ttft_s or 0.0,
                       e2e if isinstance(e2e, float) else math.nan, meta.charge or 0.0)
            )  # fmt: skip
            completion += meta.completion_tokens
        progress.advance()

    try:
        await asyncio.gather(*(one(r) for r in reqs))
    finally:
        await client.aclose()
    return served, completion, failed


def run_setup(
    setup: Setup,
    reqs: list[TextRequest],
    config: EngineConfig,
    speed: float,
    progress: Progress,
    policy: str = ENGINE_POLICY,
) -> dict:
    """One setup, start to end, the engines ordering by ``policy``: its merged and
    per-replica figures."""
    single = setup.policy == SINGLE
    configs = [scaled(config, setup.replicas)] if single else [config] * setup.replicas
    router = None if single else {"policy": setup.policy, **setup.thresholds}
    progress.set_label(setup.label)
    with (
        tempfile.TemporaryDirectory() as work,
        Fleet(configs, speed, Path(work), router, policy) as fleet,
    ):
        served, completion, failed = asyncio.run(drive(fleet.url, reqs, speed, progress))
        time.sleep(0.3)  # the last round records reach their files
        replica_of = fleet.replica_of()
        counts = fleet.cache_counts()
    return figures(setup, served, counts, replica_of, completion=completion, failed=failed)


def figures(
    setup: Setup,
    served: list[Served],
    counts: dict[str, tuple[float, float]],
    replica_of: dict[str, str],
    *,
    completion: int,
    failed: int,
) -> dict:
    """A setup's row: merged figures and one per replica."""

    def row(part: list[Served], cached: float, prompt: float) -> dict:
        if not part:
            return {"requests": 0}
        makespan = max(s.arrival + s.e2e_s for s in part) - min(s.arrival for s in part)
        m = summarize(part, makespan_s=makespan, tokens=int(prompt) + completion,
                      cache_hit_rate=cached / prompt if prompt else math.nan)  # fmt: skip
        by_class = {
            cls: mean([s.ttft_s for s in part if s.bid_class == cls])
            for cls in ("urgent", "background")
        }
        return {
            "requests": len(part),
            **{k: getattr(m, k) for k in ROW_METRICS},
            "urgent_mean_ttft_s": by_class["urgent"],
            "background_mean_ttft_s": by_class["background"],
            # What the auction buys: how much sooner the urgent (high-bid) fifth is served than
            # the rest. In one queue every bid competes with every other; behind the gateway
            # only with those the gateway sent to the same replica.
            "separation": ratio(by_class["background"], by_class["urgent"]),
        }

    total_cached = sum(c for c, _ in counts.values())
    total_prompt = sum(p for _, p in counts.values())
    per_replica = {
        engine_id: row([s for s in served if replica_of.get(s.id) == engine_id], cached, prompt)
        for engine_id, (cached, prompt) in sorted(counts.items())
    }
    return {
        "replicas": setup.replicas,
        "policy": setup.policy,
        "load": setup.load,
        "thresholds": setup.thresholds,
        "variant": setup.variant,
        "failed": failed,
        "merged": row(served, total_cached, total_prompt),
        "per_replica": per_replica,
    }


TUNING = [
    {"cache_threshold": 0.3},
    {"cache_threshold": 0.8},
    {"balance_abs_threshold": 4, "balance_rel_threshold": 1.2},
    {"balance_abs_threshold": 8, "balance_rel_threshold": 1.5},  # the live demo's
    {"balance_abs_threshold": 64, "balance_rel_threshold": 4.0},
]


def setups(args: argparse.Namespace) -> list[Setup]:
    out = []
    for n in args.replicas:
        # One replica: the gateway's policy does not matter, and the baseline is the same
        # engine without the gateway in front.
        policies = args.policies[:1] if n == 1 else args.policies
        for load in args.loads:
            out += [Setup(n, policy, load) for policy in policies]
            if n > 1 and "cache_aware" in policies:
                out += [Setup(n, "cache_aware", load, dict(VARIANTS[v]), v) for v in args.variants]
            out.append(Setup(n, SINGLE, load))
    if args.tune:
        n = max(args.replicas)
        out += [Setup(n, "cache_aware", args.tune_load, dict(t)) for t in TUNING]
    return out


def table(rows: list[dict]) -> Table:
    """The merged figures, a row per setup and load: ``bg/urg`` is the background requests'
    mean TTFT over the urgent ones' (the auction's separation); ``ttft/1`` and ``wel/1`` are the
    setup's mean TTFT and welfare as ratios to its baseline's (the one engine of the same
    capacity at the same load; for one replica, the same engine without the gateway)."""
    base = {(r["replicas"], r["load"]): r["merged"] for r in rows if r["policy"] == SINGLE}
    columns = (
        "setup", "load", "hit", "ttft", "p99", "welfare", "revenue", "bg/urg", "ttft/1", "wel/1"
    )  # fmt: skip
    lines = []
    for r in rows:
        m = r["merged"]
        if not m.get("requests"):
            continue
        b = base.get((r["replicas"], r["load"]))
        name = setup_name(r["policy"], r.get("variant", ""), r["thresholds"])
        ratios = (
            (f"{m['mean_ttft_s'] / b['mean_ttft_s']:.2f}", f"{m['welfare'] / b['welfare']:.2f}")
            if b and b.get("mean_ttft_s") and b.get("welfare")
            else ("", "")
        )
        lines.append((
            f"{r['replicas']}x {name}", f"{r['load']:g}", f"{m['cache_hit_rate']:.3f}",
            f"{m['mean_ttft_s']:.3f}", f"{m['p99_ttft_s']:.3f}", f"{m['welfare']:.2f}",
            f"{m['revenue']:.3f}", f"{m['separation']:.2f}", *ratios,
        ))  # fmt: skip
    return Table(columns, lines)


def report_html(rows: list[dict], path: Path, title: str, command: str) -> None:
    """The table, and Plotly: merged TTFT, welfare and cache hit against load, one line per
    (N, policy); and each replica's share of the requests and its cache hit."""
    fig = make_subplots(
        rows=3, cols=2,
        subplot_titles=("mean TTFT (engine s)", "welfare ($, closer to 0 is better)",
                        "cache hit rate", "requests per replica (load 1 or nearest)",
                        "separation: background / urgent mean TTFT", "revenue ($)"),
    )  # fmt: skip
    # Each line's figure, by the chart it is drawn in (row, column); the bars go in (2, 2).
    cells = {(1, 1): "mean_ttft_s", (1, 2): "welfare", (2, 1): "cache_hit_rate",
             (3, 1): "separation", (3, 2): "revenue"}  # fmt: skip

    def shown(r: dict) -> str | None:
        """A row's line name; None for a --tune point (one load only)."""
        if r["thresholds"] and not r.get("variant"):
            return None
        return f"{r['replicas']}x {setup_name(r['policy'], r.get('variant', ''), {})}"

    lines: dict[str, list[dict]] = {}
    for r in rows:
        if (name := shown(r)) and r["merged"].get("requests"):
            lines.setdefault(name, []).append(r)
    for name, part in lines.items():
        part.sort(key=lambda r: r["load"])
        loads = [r["load"] for r in part]
        dash = "dot" if SINGLE in name else None
        for (row, col), key in cells.items():
            fig.add_scatter(x=loads, y=[r["merged"][key] for r in part], name=name,
                            legendgroup=name, showlegend=(row, col) == (1, 1),
                            line={"dash": dash}, row=row, col=col)  # fmt: skip
    nearest = min(sorted({r["load"] for r in rows}), key=lambda x: abs(x - 1.0), default=None)
    for r in rows:
        name = shown(r)
        if name and r["policy"] != SINGLE and r["replicas"] > 1 and r["load"] == nearest:
            per = r["per_replica"]
            fig.add_bar(x=list(per), y=[v.get("requests", 0) for v in per.values()], name=name,
                        showlegend=False, row=2, col=2)  # fmt: skip
    for row, col in cells:
        fig.update_xaxes(title_text="load (x fleet capacity)", row=row, col=col)
    fig.update_layout(height=1100)
    write_page(
        path, title, [Section("Merged figures", table(rows).text(), figures=[fig])], command=command
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.replicas", description=__doc__)
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--loads", type=float, nargs="+", default=[0.8, 1.0, 1.2, 1.5])
    p.add_argument("--policies", nargs="+", default=["cache_aware", "round_robin"],
                   choices=["cache_aware", "round_robin", "random", "power_of_two"])  # fmt: skip
    p.add_argument(
        "--variants", nargs="*", default=[], choices=sorted(VARIANTS),
        help="also run cache_aware with these gateway settings (VARIANTS)",
    )  # fmt: skip
    p.add_argument("--requests", type=int, default=240)
    p.add_argument("--groups", type=int, default=12)
    p.add_argument(
        "--engine-rps",
        type=float,
        default=6.0,
        help="one engine's capacity in requests per wall second (sets the speed)",
    )
    p.add_argument("--engine-policy", default=ENGINE_POLICY, choices=list(POLICIES),
                   help="the engines' ordering policy (fcfs: what the auction is measured "
                   "against; load stays relative to the DFS auction's capacity)")  # fmt: skip
    p.add_argument("--tune", action="store_true", help="also try other cache-aware thresholds")
    p.add_argument("--tune-load", type=float, default=1.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=Path("var/bench/replicas.json"))
    p.add_argument("--html", type=Path, default=Path("var/bench/replicas.html"))
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.replicas) or any(x <= 0 for x in args.loads):
        p.error("--replicas and --loads must be positive")
    # A KV cache that holds a few system prompts, not all: where a prefix lands matters.
    config = EngineConfig(kv_capacity_tokens=24_000, max_running_requests=64)
    base = shared_prefix_workload(
        groups=args.groups, requests=args.requests, system_words=300, question_words=30,
        output_len=24, seed=args.seed,
    )  # fmt: skip
    capacity = engine_capacity_rps(base, config)
    speed = args.engine_rps / capacity
    plan = setups(args)
    progress = Progress(len(plan) * len(base), enabled=not args.no_progress)
    print(
        f"one engine: {capacity:.1f} requests per engine second on this workload; "
        f"speed {speed:.4g} (about {args.engine_rps:g} requests per wall second); "
        f"{len(plan)} runs of {len(base)} requests",
        file=sys.stderr,
    )
    rows = []
    for setup in plan:
        rate = setup.load * setup.replicas * capacity
        reqs = with_arrivals(base, rate, args.seed)
        rows.append(run_setup(setup, reqs, config, speed, progress, args.engine_policy))
    progress.close()
    meta = {
        "command": command_line("benchmarks.replicas", argv),
        "engine_capacity_rps": capacity,
        "speed": speed,
        "engine_policy": args.engine_policy,
        "config": asdict(config),
        "requests": len(base),
        "groups": args.groups,
        "cpu_count": os.cpu_count(),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    title = (
        f"Replicas behind SGLang's model gateway vs one engine of the same capacity "
        f"({len(base)} shared-prefix requests, {args.groups} groups, DFS auction on each)"
    )
    report_html(rows, args.html, title, meta["command"])
    print(table(rows).text())
    print(f"JSON: {args.json}  report: {args.html}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
