"""``python -m benchmarks.gateway``: the gateway's added latency over the engine, its saturation
point and its cost, per server and number of workers, side by side in one run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/market \\
        python -m benchmarks.gateway --servers daphne:1,uvicorn:1,granian:1,uvicorn:2 \\
        --rates 100,200,300,400 --duration 10 --json var/bench/gateway.json \\
        --html var/bench/gateway.html

Starts the simulated engine (``--engine-speed``, default 1000: its own step times shrink to
microseconds) as a subprocess on the database of ``DATABASE_URL`` (migrated first), with a fresh
tenant (an API key, a monthly budget) and a market pointing at the engine. Then, for each server
configuration (``SERVER:WORKERS``, served as ``config.serving`` says, DEBUG off, the gateway's
other settings such as ``GATEWAY_DB_THREADS`` from this environment), one after the other:

- **The rate sweep**, non-streamed: for each rate, ascending, two open-loop Poisson arrival
  streams run side by side for ``--duration`` seconds, one through the gateway
  (``POST /v1/completions``, with a bid) and one straight to the engine (``POST /generate``, the
  baseline), with tiny prompts and ``max_tokens`` 1; each request is sent at its time whatever
  the others are doing. Latency: from sending a request to having read its whole answer. The
  gateway's added latency is the difference of the two distributions' percentiles. A sweep stops
  at the first rate it cannot carry (with ``--repeat`` above 1, every rate is measured). Its
  **saturation point** is the highest rate it carried: achieved >= 0.97 x offered and added
  p99 <= 50 ms.
- **Streaming** at ``--stream-rate`` (100): the same two streams with ``stream: true``; the
  figure is the time to the first byte of the answer's body, added by the gateway.
- **CPU per request**: user + system CPU of the gateway's processes (the server and its workers)
  over a point, divided by the requests it answered.

``floor:N`` in ``--servers`` measures the machine's floor instead of a gateway: uvicorn serving
``benchmarks.gateway_floor``, a bare proxy to the engine that commits N one-row inserts per
request on PostgreSQL through an async driver (``floor:2``: what two database round trips and an
HTTP hop cost here, with nothing of the gateway's own work).

``--soak SERVER:WORKERS`` then runs that configuration at ``--soak-rate`` for ``--soak-s``
seconds (300 in the issue's check) and reports each gateway process's resident memory, sampled
every 5 s: growth from the mean of the first minute (after a warm-up) to the mean of the last.

The load generator runs on uvloop in this process; on a small machine it, the engine and the
gateway share the cores, so the figures are ratios of one run, not capacities. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import aiohttp
import plotly.graph_objects as go
import psutil
import uvloop
from plotly.subplots import make_subplots

from benchmarks.html import Section, Table, command_line, write_json, write_page
from benchmarks.metrics import mean, percentile
from benchmarks.options import floats
from config.serving import SERVERS, server_argv
from engines.router import free_ports, http_wait

REPO = Path(__file__).resolve().parents[1]
WARMUP_REQUESTS = 300
# The saturation point's criteria (the issue's): achieved/offered and the added p99, ms.
CARRIED_SHARE = 0.97
CARRIED_ADDED_P99_MS = 50.0
SOAK_SAMPLE_S = 5.0
SOAK_WARMUP_S = 30.0
SOAK_WINDOW_S = 60.0
FLOOR = "floor"  # a pseudo-server: benchmarks.gateway_floor, WORKERS read as commits
FLOOR_MAX_COMMITS = 8
BID = "0.001"  # every gateway request's bid, $/s
MODEL = "bench/sim"  # the bench market's served model
PERCENTILES = (50, 95, 99)


@dataclass
class PathResult:
    """One arrival stream's outcome. Milliseconds; rates in requests per second. For a
    non-streamed request the first byte is the answer's last."""

    sent: int
    ok: int
    errors: int
    offered_rate: float  # what was sent per second of the stream (Poisson: near the rate)
    achieved_rate: float  # answered per second, to the last answer
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    ttfb_p50_ms: float
    ttfb_p95_ms: float
    ttfb_p99_ms: float


@dataclass
class RatePoint:
    """Both streams at one offered rate."""

    rate: float
    stream: bool
    gateway: PathResult
    direct: PathResult
    gateway_cpu_ms_per_request: float

    def added(self, latency: str) -> float:
        """What the gateway added to ``latency`` (a ``PathResult`` field, ms): its stream's
        figure less the engine's."""
        return getattr(self.gateway, latency) - getattr(self.direct, latency)

    def added_ms(self) -> dict[str, float]:
        """The added percentiles (ms): of the whole answer, or of the first byte when
        streamed."""
        prefix = "ttfb_" if self.stream else ""
        return {f"p{q}": self.added(f"{prefix}p{q}_ms") for q in PERCENTILES}

    @property
    def carried(self) -> bool:
        """Whether the gateway carried this rate (the saturation point's criteria): what it
        answered per second against what its stream sent per second (a Poisson stream's count
        is itself a few percent off the rate)."""
        return (
            self.gateway.achieved_rate >= CARRIED_SHARE * self.gateway.offered_rate
            and self.added("p99_ms") <= CARRIED_ADDED_P99_MS
        )


@dataclass
class ServerRun:
    """One server configuration's sweep, streaming point and saturation point."""

    server: str
    workers: int
    sweep: list[RatePoint] = field(default_factory=list)
    streaming: RatePoint | None = None
    saturation_rate: float | None = None  # None: not even the lowest rate was carried

    @property
    def name(self) -> str:
        return f"{self.server}:{self.workers}"


def saturation_rate(points: list[RatePoint]) -> float | None:
    """The highest rate of a sweep (ascending) up to which every rate was carried."""
    ascending = sorted(points, key=lambda p: p.rate)
    carried = list(itertools.takewhile(lambda p: p.carried, ascending))
    return carried[-1].rate if carried else None


def parse_configs(text: str) -> list[tuple[str, int]]:
    """``"daphne:1,uvicorn:2"`` -> [("daphne", 1), ("uvicorn", 2)] (``:1`` may be left out;
    ``floor:N``: the floor with N commits)."""
    configs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        server, _, workers = part.partition(":")
        if server == FLOOR:
            commits = int(workers or 0)
            if not 0 <= commits <= FLOOR_MAX_COMMITS:
                raise ValueError(f"{part}: the floor commits 0 to {FLOOR_MAX_COMMITS} times")
            configs.append((FLOOR, commits))
            continue
        n = int(workers or 1)
        server_argv(server, host="127.0.0.1", port=0, workers=n)  # refuses what cannot run
        configs.append((server, n))
    if not configs:
        raise ValueError("no server configuration given")
    return configs


def setup_database(engine_url: str) -> str:
    """Migrate, then create a fresh tenant with a key and a budget, and the bench market.
    Returns the API key."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    from accounts.models import Tenant
    from accounts.services import api_key_create, budget_set
    from market.models import Market

    call_command("migrate", verbosity=0)
    slug = f"bench-{uuid.uuid4().hex[:8]}"
    tenant = Tenant.objects.create(name=f"Benchmark {slug}", slug=slug)
    budget_set(tenant=tenant, limit="1000000", period="month")
    _, key = api_key_create(tenant=tenant, name="bench", created_by=None)
    Market.objects.update_or_create(
        slug="gateway-bench",
        defaults={
            "name": "Gateway benchmark", "served_model": MODEL, "engine_url": engine_url,
            "price_input_per_mtok": "3", "price_cached_input_per_mtok": "0.3",
            "price_output_per_mtok": "15", "reserve": "0", "is_active": True,
        },
    )  # fmt: skip
    connections.close_all()
    return key


def start(
    argv: list[str], *, log: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A subprocess in the repository, ``env`` over this one's, its output to ``log`` (or
    nowhere)."""
    out = subprocess.DEVNULL if log is None else log.open("wb")
    try:
        return subprocess.Popen(
            argv, cwd=REPO, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT
        )
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a subprocess (its workers with it); kill what has not ended in 10 s."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def processes(proc: subprocess.Popen) -> list[psutil.Process]:
    """The server process and its workers."""
    root = psutil.Process(proc.pid)
    return [root, *root.children(recursive=True)]


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """User + system CPU seconds used so far by ``procs`` (those still alive)."""
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = p.cpu_times()
            total += times.user + times.system
    return total


@dataclass(frozen=True)
class Target:
    """Where one stream sends what."""

    url: str
    body: dict
    headers: dict[str, str]

    def streamed(self) -> Target:
        return Target(self.url, {**self.body, "stream": True}, self.headers)


async def one(
    session: aiohttp.ClientSession, target: Target, body: dict
) -> tuple[float, float, bool]:
    """Send one request: (ms to the first byte of the body, ms to the last, whether it was a
    200 read to its end)."""
    started = time.perf_counter()
    first = None
    try:
        async with session.post(target.url, json=body, headers=target.headers) as response:
            async for _ in response.content.iter_any():
                if first is None:
                    first = time.perf_counter()
            ok = response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        ok = False  # refused, reset, or past --timeout: an error
    ended = time.perf_counter()
    return ((first or ended) - started) * 1000, (ended - started) * 1000, ok


async def arrivals_stream(
    session: aiohttp.ClientSession,
    target: Target,
    *,
    rate: float,
    duration_s: float,
    seed: int,
    rid_prefix: str,
) -> PathResult:
    """Open loop: one task per Poisson arrival at its scheduled time, for ``duration_s``."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    start_at = loop.time() + 0.05
    tasks, t = [], 0.0
    while (t := t + rng.expovariate(rate)) <= duration_s:
        delay = start_at + t - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        body = dict(target.body)
        if "rid" in body:
            body["rid"] = f"{rid_prefix}-{len(tasks)}"
        tasks.append(asyncio.create_task(one(session, target, body)))
    done = await asyncio.gather(*tasks)
    elapsed = loop.time() - start_at
    ttfbs = [ttfb for ttfb, _, ok in done if ok]
    totals = [total for _, total, ok in done if ok]
    ok = len(totals)
    return PathResult(
        sent=len(done),
        ok=ok,
        errors=len(done) - ok,
        offered_rate=len(done) / duration_s,
        achieved_rate=ok / elapsed if elapsed > 0 else 0.0,
        **{f"p{q}_ms": percentile(totals, q) for q in PERCENTILES},
        mean_ms=mean(totals),
        **{f"ttfb_p{q}_ms": percentile(ttfbs, q) for q in PERCENTILES},
    )


@dataclass(frozen=True)
class Paths:
    """The gateway's and the engine's targets."""

    gateway: Target
    direct: Target


async def rate_point(
    session: aiohttp.ClientSession,
    paths: Paths,
    procs: list[psutil.Process],
    *,
    rate: float,
    duration_s: float,
    stream: bool = False,
) -> RatePoint:
    """Both streams at ``rate`` for ``duration_s``, with ``stream: true`` when ``stream``."""
    if stream:
        paths = Paths(paths.gateway.streamed(), paths.direct.streamed())
    run = uuid.uuid4().hex[:8]
    cpu_before = cpu_seconds(procs)
    gw, dr = await asyncio.gather(
        arrivals_stream(session, paths.gateway, rate=rate, duration_s=duration_s, seed=1,
                        rid_prefix=f"g{run}"),
        arrivals_stream(session, paths.direct, rate=rate, duration_s=duration_s, seed=2,
                        rid_prefix=f"d{run}"),
    )  # fmt: skip
    cpu = cpu_seconds(procs) - cpu_before
    return RatePoint(rate, stream, gw, dr, cpu * 1000 / gw.ok if gw.ok else float("nan"))


def _progress(name: str, p: RatePoint) -> None:
    added = " / ".join(f"{v:.2f}" for v in p.added_ms().values())
    print(
        f"  {name} @ {p.rate:g} req/s ({'stream TTFB' if p.stream else 'total'}): achieved "
        f"{p.gateway.achieved_rate:.1f}, added p50/p95/p99 {added} ms, "
        f"{p.gateway_cpu_ms_per_request:.2f} ms CPU/request"
        + ("" if p.stream or p.carried else "  (not carried)"),
        file=sys.stderr,
        flush=True,
    )


async def _warmed(session: aiohttp.ClientSession, paths: Paths, proc: subprocess.Popen) -> None:
    """Once the gateway answers, ``WARMUP_REQUESTS`` requests through it and to the engine."""
    http_wait(paths.gateway.url.replace("/v1/completions", "/v1/models"), proc)
    for _ in range(WARMUP_REQUESTS):
        await one(session, paths.gateway, paths.gateway.body)
        await one(session, paths.direct, {**paths.direct.body, "rid": f"warm-{uuid.uuid4().hex}"})


async def server_run(
    session: aiohttp.ClientSession,
    paths: Paths,
    proc: subprocess.Popen,
    result: ServerRun,
    args: argparse.Namespace,
) -> ServerRun:
    await _warmed(session, paths, proc)
    procs = processes(proc)
    for rate in args.rates:
        point = await rate_point(session, paths, procs, rate=rate, duration_s=args.duration)
        result.sweep.append(point)
        _progress(result.name, point)
        await asyncio.sleep(1)
        # With repeats, every repeat measures every rate, so that each median is over the same
        # points.
        if not point.carried and args.repeat == 1:
            break
    result.saturation_rate = saturation_rate(result.sweep)
    if args.stream_rate > 0:
        result.streaming = await rate_point(
            session, paths, procs, rate=args.stream_rate, duration_s=args.duration, stream=True
        )
        _progress(result.name, result.streaming)
    return result


@dataclass
class Soak:
    """Resident memory of each gateway process over a long run at one rate."""

    server: str
    workers: int
    rate: float
    duration_s: float
    samples: dict[int, list[tuple[float, int]]]  # pid -> (seconds since start, RSS bytes)
    growth: dict[int, float]  # pid -> mean RSS of the last minute / of the first - 1
    achieved_rate: float

    @property
    def max_growth(self) -> float:
        return max(self.growth.values(), default=float("nan"))


def rss_growth(samples: list[tuple[float, int]], *, window_s: float = SOAK_WINDOW_S) -> float:
    """Mean RSS of the last ``window_s`` of samples over the mean of the first, minus 1."""
    if not samples:
        return float("nan")
    t0, t1 = samples[0][0], samples[-1][0]
    first = [rss for t, rss in samples if t <= t0 + window_s]
    last = [rss for t, rss in samples if t >= t1 - window_s]
    return mean(last) / mean(first) - 1


async def soak(
    session: aiohttp.ClientSession,
    paths: Paths,
    proc: subprocess.Popen,
    *,
    server: str,
    workers: int,
    args: argparse.Namespace,
) -> Soak:
    await _warmed(session, paths, proc)
    # Warm-up at the soak's rate: the first minute's mean is taken after it.
    await arrivals_stream(session, paths.gateway, rate=args.soak_rate, duration_s=SOAK_WARMUP_S,
                          seed=3, rid_prefix="soak-warm")  # fmt: skip
    procs = processes(proc)
    workers_only = procs[1:] if len(procs) > 1 else procs  # uvicorn's supervisor serves nothing
    samples: dict[int, list[tuple[float, int]]] = {p.pid: [] for p in workers_only}
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def sample() -> None:
        while True:
            for p in workers_only:
                with contextlib.suppress(psutil.NoSuchProcess):
                    samples[p.pid].append((loop.time() - started, p.memory_info().rss))
            await asyncio.sleep(SOAK_SAMPLE_S)

    sampler = asyncio.create_task(sample())
    try:
        result = await arrivals_stream(
            session, paths.gateway, rate=args.soak_rate, duration_s=args.soak_s, seed=4,
            rid_prefix="soak",
        )  # fmt: skip
    finally:
        sampler.cancel()
    return Soak(
        server=server,
        workers=workers,
        rate=args.soak_rate,
        duration_s=args.soak_s,
        samples=samples,
        growth={pid: rss_growth(s) for pid, s in samples.items()},
        achieved_rate=result.achieved_rate,
    )


class Gateways:
    """Starts each configuration's gateway (or the floor) on a fresh port, against
    ``engine_url``; their logs in ``logs``, and the paths of the two streams."""

    def __init__(self, logs: Path, engine_url: str, key: str) -> None:
        self.logs, self.engine_url, self.key = logs, engine_url, key
        # As in production: DEBUG off (no query log), access logs off (config.serving).
        self.env = {"DEBUG": "0", "ALLOWED_HOSTS": "127.0.0.1",
                    "SECRET_KEY": os.environ.get("SECRET_KEY") or uuid.uuid4().hex}  # fmt: skip

    def started(self, server: str, workers: int) -> tuple[subprocess.Popen, Paths]:
        (port,) = free_ports(1)
        env = self.env
        if server == FLOOR:
            argv = server_argv("uvicorn", host="127.0.0.1", port=port,
                               application="benchmarks.gateway_floor:app")  # fmt: skip
            env = {**env, "GATEWAY_FLOOR_COMMITS": str(workers),
                   "GATEWAY_FLOOR_ENGINE": self.engine_url,
                   "GATEWAY_FLOOR_DSN": os.environ.get("DATABASE_URL", "")}  # fmt: skip
        else:
            argv = server_argv(server, host="127.0.0.1", port=port, workers=workers)
        proc = start(argv, env=env, log=self.logs / f"gateway-{server}-{workers}.log")
        gateway = Target(
            url=f"http://127.0.0.1:{port}/v1/completions",
            body={"model": MODEL, "prompt": "Hi there", "max_tokens": 1, "bid": BID},
            headers={"Authorization": f"Bearer {self.key}"},
        )
        sampling = {"max_new_tokens": 1, "custom_params": {"bid": float(BID)}}
        direct = Target(
            url=f"{self.engine_url}/generate",
            body={"rid": "x", "text": "Hi there", "sampling_params": sampling},
            headers={},
        )
        return proc, Paths(gateway, direct)


def floor_table(create: bool) -> None:
    """Create (or drop) the floor's table in the benchmark's database."""
    from django.db import connection

    from benchmarks.gateway_floor import TABLE

    with connection.cursor() as cursor:
        if create:
            cursor.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY)")
        else:
            cursor.execute(f"DROP TABLE IF EXISTS {TABLE}")
    connection.close()


async def measure(
    args: argparse.Namespace, gateways: Gateways
) -> tuple[list[ServerRun], Soak | None]:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    runs: list[ServerRun] = []
    soaked = None
    todo = [(r, c) for r in range(args.repeat) for c in args.configs]  # interleaved repeats
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for i, (repeat, (server, workers)) in enumerate(todo, 1):
            print(f"[{i}/{len(todo)}] {server}:{workers} (repeat {repeat + 1}/{args.repeat})",
                  file=sys.stderr, flush=True)  # fmt: skip
            proc, paths = gateways.started(server, workers)
            try:
                runs.append(
                    await server_run(session, paths, proc, ServerRun(server, workers), args)
                )
            finally:
                stop(proc)
            await asyncio.sleep(1)
        if args.soak is not None:
            server, workers = args.soak
            print(f"[soak] {server}:{workers}, {args.soak_s:g} s at {args.soak_rate:g} req/s",
                  file=sys.stderr, flush=True)  # fmt: skip
            proc, paths = gateways.started(server, workers)
            try:
                soaked = await soak(session, paths, proc, server=server, workers=workers, args=args)
            finally:
                stop(proc)
    return runs, soaked


def _median_point(points: list[RatePoint]) -> RatePoint:
    """A point whose every figure is the median of that figure over ``points`` (one rate)."""

    def median_path(paths: list[PathResult]) -> PathResult:
        return PathResult(
            **{
                f.name: percentile([getattr(p, f.name) for p in paths], 50)
                for f in fields(PathResult)
            }
        )

    return RatePoint(
        rate=points[0].rate,
        stream=points[0].stream,
        gateway=median_path([p.gateway for p in points]),
        direct=median_path([p.direct for p in points]),
        gateway_cpu_ms_per_request=percentile([p.gateway_cpu_ms_per_request for p in points], 50),
    )


def merged(runs: list[ServerRun]) -> list[ServerRun]:
    """One run per configuration from its repeats: at each rate every repeat measured, each
    figure the median over the repeats (the machine is shared: a single repeat can be hit by
    a neighbour's burst); the saturation point from those medians."""
    by_config: dict[tuple[str, int], list[ServerRun]] = {}
    for run in runs:
        by_config.setdefault((run.server, run.workers), []).append(run)
    out = []
    for (server, workers), repeats in by_config.items():
        result = ServerRun(server=server, workers=workers)
        rates = sorted(set.intersection(*({p.rate for p in r.sweep} for r in repeats)))
        for rate in rates:
            result.sweep.append(
                _median_point([p for r in repeats for p in r.sweep if p.rate == rate])
            )
        streams = [r.streaming for r in repeats if r.streaming is not None]
        result.streaming = _median_point(streams) if streams else None
        result.saturation_rate = saturation_rate(result.sweep)
        out.append(result)
    return out


def summary(runs: list[ServerRun], *, target_rate: float = 100.0) -> list[dict]:
    """Per configuration: the issue's figures at ``target_rate`` and the saturation point,
    with its ratio to Daphne's (one process, today's gateway) of the same run."""
    base = next((r for r in runs if r.server == "daphne" and r.workers == 1), None)
    rows = []
    for run in runs:
        at = next((p for p in run.sweep if p.rate == target_rate), None)
        added = at.added_ms() if at else {}
        streamed = run.streaming.added_ms() if run.streaming else {}
        ratio = None
        if base is not None and base.saturation_rate and run.saturation_rate:
            ratio = run.saturation_rate / base.saturation_rate
        rows.append(
            {
                "config": run.name,
                **{f"added_{k}_ms": added.get(k) for k in ("p50", "p95", "p99")},
                "cpu_ms_per_request": at.gateway_cpu_ms_per_request if at else None,
                **{f"stream_ttfb_added_{k}_ms": streamed.get(k) for k in ("p50", "p95", "p99")},
                "saturation_rate": run.saturation_rate,
                "saturation_over_daphne": ratio,
            }
        )
    return rows


def _f(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _three(row: dict, prefix: str) -> str:
    return " / ".join(_f(row[f"{prefix}_{k}_ms"]) for k in ("p50", "p95", "p99"))


def summary_table(rows: list[dict], *, target_rate: float = 100.0) -> Table:
    """The summary of ``--json`` (:func:`summary`'s rows) as a table."""
    return Table(
        ("server:workers", f"added p50 / p95 / p99 at {target_rate:g} req/s (ms)",
         "gateway CPU per request (ms)", "stream TTFB added p50 / p95 / p99 (ms)",
         "saturation (req/s)", "x daphne:1"),
        [(r["config"], _three(r, "added"), _f(r["cpu_ms_per_request"]),
          _three(r, "stream_ttfb_added"), _f(r["saturation_rate"], "g"),
          _f(r["saturation_over_daphne"])) for r in rows],
    )  # fmt: skip


def soak_text(s: Soak) -> str:
    parts = [
        f"soak {s.server}:{s.workers}: {s.duration_s:g} s at {s.rate:g} req/s (achieved "
        f"{s.achieved_rate:.1f}); RSS growth, first minute to last, per process:"
    ]
    for pid, growth in s.growth.items():
        first_mb = s.samples[pid][0][1] / 2**20 if s.samples[pid] else float("nan")
        parts.append(f"  pid {pid}: {growth:+.2%} (from {first_mb:.1f} MiB)")
    return "\n".join(parts)


def sweep_figure(runs: list[ServerRun]) -> go.Figure:
    """Added p95 and p99, achieved / offered and CPU per request against the offered rate."""
    fig = make_subplots(
        rows=2, cols=2,
        subplot_titles=("added p95 (ms) vs offered rate", "added p99 (ms) vs offered rate",
                        "achieved / offered rate (gateway)", "gateway CPU per request (ms)"),
    )  # fmt: skip
    for run in runs:
        rates = [p.rate for p in run.sweep]
        for i, (row, col, values) in enumerate((
            (1, 1, [p.added("p95_ms") for p in run.sweep]),
            (1, 2, [p.added("p99_ms") for p in run.sweep]),
            (2, 1, [p.gateway.achieved_rate / p.gateway.offered_rate for p in run.sweep]),
            (2, 2, [p.gateway_cpu_ms_per_request for p in run.sweep]),
        )):  # fmt: skip
            fig.add_scatter(x=rates, y=values, name=run.name, legendgroup=run.name,
                            showlegend=i == 0, mode="lines+markers", row=row, col=col)  # fmt: skip
    for col in (1, 2):
        fig.update_yaxes(type="log", row=1, col=col)
        fig.update_xaxes(title_text="offered rate (req/s)", row=2, col=col)
    fig.add_hline(y=CARRIED_ADDED_P99_MS, line_dash="dot", row=1, col=2)
    fig.add_hline(y=CARRIED_SHARE, line_dash="dot", row=2, col=1)
    fig.update_layout(height=800)
    return fig


def soak_figure(soaked: Soak) -> go.Figure:
    """Each gateway process's RSS over the soak."""
    fig = go.Figure()
    for pid, samples in soaked.samples.items():
        fig.add_scatter(x=[t for t, _ in samples], y=[rss / 2**20 for _, rss in samples],
                        name=f"pid {pid}", mode="lines")  # fmt: skip
    fig.update_layout(xaxis_title="seconds", yaxis_title="RSS (MiB)")
    return fig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gateway",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--servers",
        default="daphne:1,uvicorn:1,granian:1,uvicorn:2",
        help="server configurations SERVER:WORKERS, comma-separated, run in this order "
        f"(servers: {', '.join(SERVERS)}; {FLOOR}:N the floor)",
    )
    p.add_argument("--server", help="one server (with --workers): instead of --servers")
    p.add_argument("--workers", type=int, default=1, help="workers of --server")
    p.add_argument(
        "--rates",
        type=floats,
        default="100,150,200,250,300,400,500",
        help="offered rates of the sweep, requests per second, comma-separated",
    )
    p.add_argument("--duration", type=float, default=10.0, help="seconds per rate")
    p.add_argument("--repeat", type=int, default=1,
                   help="measure every configuration this many times, interleaved; report the "
                   "medians")  # fmt: skip
    p.add_argument("--stream-rate", type=float, default=100.0,
                   help="rate of the streaming point (0: none)")  # fmt: skip
    p.add_argument("--engine-speed", type=float, default=1000.0)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds before a request fails")
    p.add_argument("--soak", metavar="SERVER:WORKERS",
                   help="then run this one for --soak-s seconds and report its memory")  # fmt: skip
    p.add_argument("--soak-s", type=float, default=300.0)
    p.add_argument("--soak-rate", type=float, default=100.0)
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.add_argument("--html", metavar="OUT", help="write a Plotly report")
    args = p.parse_args(argv)
    try:
        args.configs = parse_configs(
            f"{args.server}:{args.workers}" if args.server else args.servers
        )
        args.soak = parse_configs(args.soak)[0] if args.soak else None
    except ValueError as exc:
        p.error(str(exc))
    args.rates = sorted(args.rates)
    if args.duration <= 0 or args.repeat < 1:
        p.error("duration and repeat must be positive")
    return args


def _json(
    runs: list[ServerRun], repeats: list[ServerRun], soaked: Soak | None, args: argparse.Namespace
) -> dict:
    def point_dict(p: RatePoint) -> dict:
        return {**asdict(p), "added_ms": p.added_ms(), "carried": p.carried}

    def run_dict(run: ServerRun) -> dict:
        return {
            **asdict(run),
            "config": run.name,
            "sweep": [point_dict(p) for p in run.sweep],
            "streaming": point_dict(run.streaming) if run.streaming else None,
        }

    return {
        "command": args.command,
        "settings": {
            "duration_s": args.duration,
            "engine_speed": args.engine_speed,
            "rates": args.rates,
            "stream_rate": args.stream_rate,
            "carried": {"share": CARRIED_SHARE, "added_p99_ms": CARRIED_ADDED_P99_MS},
            "cpus": os.cpu_count(),
            "repeat": args.repeat,
        },
        "summary": summary(runs),
        "runs": [run_dict(r) for r in runs],  # the medians over the repeats
        "repeats": [run_dict(r) for r in repeats],  # each repeat as measured
        "soak": None if soaked is None else {**asdict(soaked), "max_growth": soaked.max_growth},
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.command = command_line("benchmarks.gateway", argv)
    uvloop.install()  # the load generator's own cost, kept small
    (engine_port,) = free_ports(1)
    engine_url = f"http://127.0.0.1:{engine_port}"
    logs = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    engine = start(
        [sys.executable, "-m", "engines.sim.server", "--port", str(engine_port), "--speed",
         str(args.engine_speed), "--market", "gateway-bench", "--log-level", "WARNING"],
        log=logs / "engine.log",
    )  # fmt: skip
    floors = any(server == FLOOR and n for server, n in args.configs)
    try:
        key = setup_database(engine_url)
        if floors:
            floor_table(create=True)
        http_wait(f"{engine_url}/health", engine)
        repeats, soaked = asyncio.run(measure(args, Gateways(logs, engine_url, key)))
        runs = merged(repeats)
    finally:
        stop(engine)
        if floors:
            floor_table(create=False)
    settings = (
        f"{args.duration:g} s per rate, medians of {args.repeat} interleaved repeat(s), Poisson "
        f"arrivals, engine speed {args.engine_speed:g}, DEBUG off, GATEWAY_DB_THREADS="
        f"{os.environ.get('GATEWAY_DB_THREADS', 'default')}, {os.cpu_count()} CPUs; latency: "
        f"send to last byte (stream: to the first), ms; carried: achieved >= {CARRIED_SHARE:g} x "
        f"offered and added p99 <= {CARRIED_ADDED_P99_MS:g} ms; logs in {logs}"
    )
    table = summary_table(summary(runs))
    print(f"{settings}\n\n{table.markdown()}")
    if soaked is not None:
        print("\n" + soak_text(soaked))
    if args.json:
        write_json(args.json, _json(runs, repeats, soaked, args))
    if args.html:
        sections = [Section("The rate sweep", settings, [table], [sweep_figure(runs)])]
        if soaked is not None:
            sections.append(Section("Soak", soak_text(soaked), figures=[soak_figure(soaked)]))
        write_page(args.html, "Gateway benchmark", sections, command=args.command)


if __name__ == "__main__":
    main()
