"""``python -m benchmarks.gateway``: the gateway's added latency over the engine, its saturation
point and its cost, per server and number of workers, side by side in one run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/market \\
        python -m benchmarks.gateway --servers daphne:1,uvicorn:1,granian:1,uvicorn:2 \\
        --rates 100,200,300,400 --duration 10 --json var/bench/gateway.json \\
        --html var/bench/gateway.html

Starts the simulated engine (``--engine-speed``, default 1000: its own step times shrink to
microseconds) as a subprocess on the database of ``DATABASE_URL`` (migrated first), with a fresh
tenant (an API key, a monthly budget) and a market pointing at the engine. Then, for each server
configuration (``SERVER:WORKERS``, served as ``config.serving`` says, DEBUG off), one after the
other in this run:

- **The rate sweep**, non-streamed: for each rate, ascending, two open-loop arrival streams run
  side by side for ``--duration`` seconds, one through the gateway (``POST /v1/completions``,
  with a bid) and one straight to the engine (``POST /generate``, the baseline), with tiny
  prompts and ``max_tokens`` 1. Arrivals are Poisson (or ``--arrivals fixed``); each request is
  sent at its time whatever the others are doing. Latency: from sending a request to having read
  its whole answer. The gateway's added latency is the difference of the two distributions'
  percentiles. A configuration's sweep stops at the first rate it cannot carry (never with
  ``--full-sweep`` or ``--repeat`` above 1). Its **saturation point** is the highest rate it
  carried: achieved >= 0.97 x offered and added p99 <= 50 ms.
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
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import psutil

from benchmarks.metrics import percentile
from config.serving import MULTI_WORKER_SERVERS, SERVERS, server_argv

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
    """Both streams at one offered rate, and what the gateway added (gateway - direct)."""

    rate: float
    stream: bool
    gateway: PathResult
    direct: PathResult
    added_p50_ms: float
    added_p95_ms: float
    added_p99_ms: float
    added_ttfb_p50_ms: float
    added_ttfb_p95_ms: float
    added_ttfb_p99_ms: float
    gateway_cpu_ms_per_request: float

    @property
    def carried(self) -> bool:
        """Whether the gateway carried this rate (the saturation point's criteria): what it
        answered per second against what its stream sent per second (a Poisson stream's count
        is itself a few percent off the rate)."""
        return (
            self.gateway.achieved_rate >= CARRIED_SHARE * self.gateway.offered_rate
            and self.added_p99_ms <= CARRIED_ADDED_P99_MS
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
    best = None
    for point in sorted(points, key=lambda p: p.rate):
        if not point.carried:
            break
        best = point.rate
    return best


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
        if server not in SERVERS:
            raise ValueError(f"unknown server {server!r}; choose from {', '.join(SERVERS)}")
        n = int(workers or 1)
        if n < 1 or (n > 1 and server not in MULTI_WORKER_SERVERS):
            raise ValueError(f"{part}: {server} cannot run {n} workers")
        configs.append((server, n))
    if not configs:
        raise ValueError("no server configuration given")
    return configs


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def setup_database(engine_url: str) -> tuple[str, str]:
    """Migrate, then create a fresh tenant with a key and a budget, and the bench market.
    Returns (API key, served model)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command

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
            "name": "Gateway benchmark",
            "served_model": "bench/sim",
            "engine_url": engine_url,
            "price_input_per_mtok": "3",
            "price_cached_input_per_mtok": "0.3",
            "price_output_per_mtok": "15",
            "reserve": "0",
            "is_active": True,
        },
    )
    from django.db import connections

    connections.close_all()
    return key, "bench/sim"


def start(argv: list[str], *, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A subprocess in the repository, its output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop(proc: subprocess.Popen) -> None:
    """Terminate a subprocess (its workers with it); kill what has not ended in 10 s."""
    try:
        family = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        family = [proc.pid]
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
    for pid in family[1:]:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass


def processes(proc: subprocess.Popen) -> list[psutil.Process]:
    """The server process and its workers."""
    root = psutil.Process(proc.pid)
    return [root, *root.children(recursive=True)]


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """User + system CPU seconds used so far by ``procs`` (those still alive)."""
    total = 0.0
    for p in procs:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


async def wait_ready(session: aiohttp.ClientSession, url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            async with session.get(url) as response:
                if response.status < 500:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not answer in {timeout_s} s")


@dataclass(frozen=True)
class Target:
    """Where one stream sends what."""

    url: str
    body: dict
    headers: dict[str, str]


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
    arrivals: str,
    seed: int,
    rid_prefix: str,
) -> PathResult:
    """Open loop: one task per arrival at its scheduled time, for ``duration_s`` seconds."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    start_at = loop.time() + 0.05
    tasks, t, i = [], 0.0, 0
    while True:
        t += rng.expovariate(rate) if arrivals == "poisson" else 1.0 / rate
        if t > duration_s:
            break
        delay = start_at + t - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        body = dict(target.body)
        if "rid" in body:
            body["rid"] = f"{rid_prefix}-{i}"
        tasks.append(asyncio.create_task(one(session, target, body)))
        i += 1
    done = await asyncio.gather(*tasks)
    elapsed = loop.time() - start_at
    served = [(ttfb, total) for ttfb, total, ok in done if ok]
    totals = sorted(total for _, total in served)
    ttfbs = sorted(ttfb for ttfb, _ in served)
    ok = len(totals)
    return PathResult(
        sent=len(done),
        ok=ok,
        errors=len(done) - ok,
        offered_rate=len(done) / duration_s,
        achieved_rate=ok / elapsed if elapsed > 0 else 0.0,
        p50_ms=percentile(totals, 50),
        p95_ms=percentile(totals, 95),
        p99_ms=percentile(totals, 99),
        mean_ms=sum(totals) / ok if ok else float("nan"),
        ttfb_p50_ms=percentile(ttfbs, 50),
        ttfb_p95_ms=percentile(ttfbs, 95),
        ttfb_p99_ms=percentile(ttfbs, 99),
    )


@dataclass(frozen=True)
class Paths:
    """The gateway's and the engine's targets, non-streamed and streamed."""

    gateway: Target
    direct: Target

    def streamed(self) -> Paths:
        gw = Target(self.gateway.url, {**self.gateway.body, "stream": True}, self.gateway.headers)
        dr = Target(self.direct.url, {**self.direct.body, "stream": True}, self.direct.headers)
        return Paths(gw, dr)


async def rate_point(
    session: aiohttp.ClientSession,
    paths: Paths,
    procs: list[psutil.Process],
    *,
    rate: float,
    args: argparse.Namespace,
    stream: bool,
) -> RatePoint:
    run = uuid.uuid4().hex[:8]
    common = {"rate": rate, "duration_s": args.duration, "arrivals": args.arrivals}
    cpu_before = cpu_seconds(procs)
    gw, dr = await asyncio.gather(
        arrivals_stream(session, paths.gateway, seed=1, rid_prefix=f"g{run}", **common),
        arrivals_stream(session, paths.direct, seed=2, rid_prefix=f"d{run}", **common),
    )
    cpu = cpu_seconds(procs) - cpu_before
    return RatePoint(
        rate=rate,
        stream=stream,
        gateway=gw,
        direct=dr,
        added_p50_ms=gw.p50_ms - dr.p50_ms,
        added_p95_ms=gw.p95_ms - dr.p95_ms,
        added_p99_ms=gw.p99_ms - dr.p99_ms,
        added_ttfb_p50_ms=gw.ttfb_p50_ms - dr.ttfb_p50_ms,
        added_ttfb_p95_ms=gw.ttfb_p95_ms - dr.ttfb_p95_ms,
        added_ttfb_p99_ms=gw.ttfb_p99_ms - dr.ttfb_p99_ms,
        gateway_cpu_ms_per_request=cpu * 1000 / gw.ok if gw.ok else float("nan"),
    )


def _point_line(name: str, p: RatePoint) -> str:
    what = "stream TTFB" if p.stream else "total"
    added = (
        (p.added_ttfb_p50_ms, p.added_ttfb_p95_ms, p.added_ttfb_p99_ms)
        if p.stream
        else (p.added_p50_ms, p.added_p95_ms, p.added_p99_ms)
    )
    return (
        f"  {name} @ {p.rate:g} req/s ({what}): achieved {p.gateway.achieved_rate:.1f}, added "
        f"p50/p95/p99 {added[0]:.2f} / {added[1]:.2f} / {added[2]:.2f} ms, "
        f"{p.gateway_cpu_ms_per_request:.2f} ms CPU/request"
        + ("" if p.stream or p.carried else "  (not carried)")
    )


async def _warmed(session: aiohttp.ClientSession, paths: Paths) -> None:
    await wait_ready(session, paths.gateway.url.replace("/v1/completions", "/v1/models"))
    for _ in range(WARMUP_REQUESTS):
        await one(session, paths.gateway, paths.gateway.body)
        await one(session, paths.direct, {**paths.direct.body, "rid": f"warm-{uuid.uuid4().hex}"})


async def server_run(
    session: aiohttp.ClientSession,
    paths: Paths,
    proc: subprocess.Popen,
    *,
    server: str,
    workers: int,
    args: argparse.Namespace,
) -> ServerRun:
    result = ServerRun(server=server, workers=workers)
    await _warmed(session, paths)
    procs = processes(proc)
    for rate in args.rates:
        point = await rate_point(session, paths, procs, rate=rate, args=args, stream=False)
        result.sweep.append(point)
        print(_point_line(result.name, point), file=sys.stderr, flush=True)
        await asyncio.sleep(1)
        # One repeat stops at its first rate not carried; with repeats, every repeat measures
        # every rate, so that each median is over the same points.
        if not point.carried and not args.full_sweep and args.repeat == 1:
            break
    result.saturation_rate = saturation_rate(result.sweep)
    if args.stream_rate > 0:
        result.streaming = await rate_point(
            session, paths.streamed(), procs, rate=args.stream_rate, args=args, stream=True
        )
        print(_point_line(result.name, result.streaming), file=sys.stderr, flush=True)
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
    return (sum(last) / len(last)) / (sum(first) / len(first)) - 1


async def soak(
    session: aiohttp.ClientSession,
    paths: Paths,
    proc: subprocess.Popen,
    *,
    server: str,
    workers: int,
    args: argparse.Namespace,
) -> Soak:
    await _warmed(session, paths)
    # Warm-up at the soak's rate: the first minute's mean is taken after it.
    await arrivals_stream(
        session, paths.gateway, rate=args.soak_rate, duration_s=SOAK_WARMUP_S,
        arrivals=args.arrivals, seed=3, rid_prefix="soak-warm",
    )  # fmt: skip
    procs = processes(proc)
    workers_only = procs[1:] if len(procs) > 1 else procs  # uvicorn's supervisor serves nothing
    samples: dict[int, list[tuple[float, int]]] = {p.pid: [] for p in workers_only}
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def sample() -> None:
        while True:
            for p in workers_only:
                try:
                    samples[p.pid].append((loop.time() - started, p.memory_info().rss))
                except psutil.NoSuchProcess:
                    pass
            await asyncio.sleep(SOAK_SAMPLE_S)

    sampler = asyncio.create_task(sample())
    try:
        result = await arrivals_stream(
            session, paths.gateway, rate=args.soak_rate, duration_s=args.soak_s,
            arrivals=args.arrivals, seed=4, rid_prefix="soak",
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


def _gateway_env(db_threads: int | None) -> dict[str, str]:
    # As in production: DEBUG off (no query log), access logs off (config.serving).
    env = {"DEBUG": "0", "ALLOWED_HOSTS": "127.0.0.1",
           "SECRET_KEY": os.environ.get("SECRET_KEY") or uuid.uuid4().hex}  # fmt: skip
    if db_threads:
        env["GATEWAY_DB_THREADS"] = str(db_threads)
    return env


class Gateways:
    """Starts each configuration's gateway (or the floor) on a fresh port."""

    def __init__(self, logs: Path, db_threads: int | None, engine_url: str) -> None:
        self.logs, self.env = logs, _gateway_env(db_threads)
        self.engine_url = engine_url

    def started(self, server: str, workers: int) -> tuple[subprocess.Popen, str]:
        port = free_port()
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
        return proc, f"http://127.0.0.1:{port}"


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


def _paths(gateway_base: str, engine_url: str, key: str, model: str, bid: str) -> Paths:
    gateway = Target(
        url=f"{gateway_base}/v1/completions",
        body={"model": model, "prompt": "Hi there", "max_tokens": 1, "bid": bid},
        headers={"Authorization": f"Bearer {key}"},
    )
    sampling = {"max_new_tokens": 1, "custom_params": {"bid": float(bid)}}
    direct = Target(
        url=f"{engine_url}/generate",
        body={"rid": "x", "text": "Hi there", "sampling_params": sampling},
        headers={},
    )
    return Paths(gateway, direct)


async def measure(
    args: argparse.Namespace, gateways: Gateways, engine_url: str, key: str, model: str
) -> tuple[list[ServerRun], Soak | None]:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    runs: list[ServerRun] = []
    soaked = None
    todo = [(r, c) for r in range(args.repeat) for c in args.configs]  # interleaved repeats
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await wait_ready(session, f"{engine_url}/health")
        for i, (repeat, (server, workers)) in enumerate(todo, 1):
            print(f"[{i}/{len(todo)}] {server}:{workers} (repeat {repeat + 1}/{args.repeat})",
                  file=sys.stderr, flush=True)  # fmt: skip
            proc, base = gateways.started(server, workers)
            try:
                paths = _paths(base, engine_url, key, model, args.bid)
                runs.append(
                    await server_run(
                        session, paths, proc, server=server, workers=workers, args=args
                    )
                )
            finally:
                stop(proc)
            await asyncio.sleep(1)
        if args.soak is not None:
            server, workers = args.soak
            print(f"[soak] {server}:{workers}, {args.soak_s:g} s at {args.soak_rate:g} req/s",
                  file=sys.stderr, flush=True)  # fmt: skip
            proc, base = gateways.started(server, workers)
            try:
                paths = _paths(base, engine_url, key, model, args.bid)
                soaked = await soak(session, paths, proc, server=server, workers=workers, args=args)
            finally:
                stop(proc)
    return runs, soaked


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _median_of(items: list, cls: type):  # type: ignore[no-untyped-def]
    """A ``cls`` whose every numeric field is the median of that field over ``items``."""
    rows = [asdict(i) for i in items]
    fields = {}
    for name, value in rows[0].items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            fields[name] = value
        else:
            fields[name] = _median([row[name] for row in rows])
    return cls(**fields)


def _median_point(points: list[RatePoint]) -> RatePoint:
    point = _median_of(points, RatePoint)
    point.gateway = _median_of([p.gateway for p in points], PathResult)
    point.direct = _median_of([p.direct for p in points], PathResult)
    return point


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
            result.sweep.append(_median_point([_at(r, rate) for r in repeats]))  # type: ignore[misc]
        streams = [r.streaming for r in repeats if r.streaming is not None]
        result.streaming = _median_point(streams) if streams else None
        result.saturation_rate = saturation_rate(result.sweep)
        out.append(result)
    return out


def _baseline(runs: list[ServerRun]) -> ServerRun | None:
    """Today's gateway: Daphne, one process (the ratios' denominator), if it ran."""
    return next((r for r in runs if r.server == "daphne" and r.workers == 1), None)


def _at(run: ServerRun, rate: float) -> RatePoint | None:
    return next((p for p in run.sweep if p.rate == rate), None)


def summary(runs: list[ServerRun], *, target_rate: float = 100.0) -> list[dict]:
    """Per configuration: the issue's figures at ``target_rate`` and the saturation point,
    with its ratio to Daphne's (one process) of the same run."""
    base = _baseline(runs)
    rows = []
    for run in runs:
        at, streamed = _at(run, target_rate), run.streaming
        ratio = None
        if base is not None and base.saturation_rate and run.saturation_rate:
            ratio = run.saturation_rate / base.saturation_rate
        rows.append(
            {
                "config": run.name,
                "added_p50_ms": at.added_p50_ms if at else None,
                "added_p95_ms": at.added_p95_ms if at else None,
                "added_p99_ms": at.added_p99_ms if at else None,
                "cpu_ms_per_request": at.gateway_cpu_ms_per_request if at else None,
                "stream_ttfb_added_p50_ms": streamed.added_ttfb_p50_ms if streamed else None,
                "stream_ttfb_added_p95_ms": streamed.added_ttfb_p95_ms if streamed else None,
                "stream_ttfb_added_p99_ms": streamed.added_ttfb_p99_ms if streamed else None,
                "saturation_rate": run.saturation_rate,
                "saturation_over_daphne": ratio,
            }
        )
    return rows


def _f(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def table(runs: list[ServerRun], *, target_rate: float = 100.0) -> str:
    """The report as Markdown: the summary, then every rate point."""
    lines = [
        f"| server:workers | added p50 / p95 / p99 ms at {target_rate:g} req/s | CPU ms/req | "
        "stream TTFB added p50 / p95 / p99 ms | saturation req/s | x Daphne:1 |",
        "|---|---|---|---|---|---|",
    ]
    for row in summary(runs, target_rate=target_rate):
        lines.append(
            f"| {row['config']} | {_f(row['added_p50_ms'])} / {_f(row['added_p95_ms'])} / "
            f"{_f(row['added_p99_ms'])} | {_f(row['cpu_ms_per_request'])} | "
            f"{_f(row['stream_ttfb_added_p50_ms'])} / {_f(row['stream_ttfb_added_p95_ms'])} / "
            f"{_f(row['stream_ttfb_added_p99_ms'])} | {_f(row['saturation_rate'], 'g')} | "
            f"{_f(row['saturation_over_daphne'])} |"
        )
    lines += [
        "",
        "| server:workers | rate | achieved gw / direct | direct p50 / p95 / p99 ms | "
        "added p50 / p95 / p99 ms | CPU ms/req | carried |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for p in run.sweep:
            lines.append(
                f"| {run.name} | {p.rate:g} | {p.gateway.achieved_rate:.1f} / "
                f"{p.direct.achieved_rate:.1f} | {p.direct.p50_ms:.2f} / {p.direct.p95_ms:.2f} / "
                f"{p.direct.p99_ms:.2f} | {p.added_p50_ms:.2f} / {p.added_p95_ms:.2f} / "
                f"{p.added_p99_ms:.2f} | {p.gateway_cpu_ms_per_request:.2f} | "
                f"{'yes' if p.carried else 'no'} |"
            )
    return "\n".join(lines)


def soak_text(s: Soak) -> str:
    parts = [
        f"soak {s.server}:{s.workers}: {s.duration_s:g} s at {s.rate:g} req/s (achieved "
        f"{s.achieved_rate:.1f}); RSS growth, first minute to last, per process:"
    ]
    for pid, growth in s.growth.items():
        first_mb = s.samples[pid][0][1] / 2**20 if s.samples[pid] else float("nan")
        parts.append(f"  pid {pid}: {growth:+.2%} (from {first_mb:.1f} MiB)")
    return "\n".join(parts)


def write_html(runs: list[ServerRun], soaked: Soak | None, path: Path, text: str) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=(
            "added p95 (ms) vs offered rate",
            "added p99 (ms) vs offered rate",
            "achieved / offered rate (gateway)",
            "gateway CPU per request (ms)",
        ),
    )
    for run in runs:
        rates = [p.rate for p in run.sweep]
        for col, values in (
            (1, [p.added_p95_ms for p in run.sweep]),
            (2, [p.added_p99_ms for p in run.sweep]),
        ):
            fig.add_trace(
                go.Scatter(x=rates, y=values, name=run.name, legendgroup=run.name,
                           showlegend=col == 1, mode="lines+markers"),
                row=1, col=col,
            )  # fmt: skip
        fig.add_trace(
            go.Scatter(x=rates,
                       y=[p.gateway.achieved_rate / p.gateway.offered_rate for p in run.sweep],
                       name=run.name, legendgroup=run.name, showlegend=False,
                       mode="lines+markers"),
            row=2, col=1,
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(x=rates, y=[p.gateway_cpu_ms_per_request for p in run.sweep],
                       name=run.name, legendgroup=run.name, showlegend=False,
                       mode="lines+markers"),
            row=2, col=2,
        )  # fmt: skip
    for col in (1, 2):
        fig.update_yaxes(type="log", row=1, col=col)
    fig.add_hline(y=CARRIED_ADDED_P99_MS, line_dash="dot", row=1, col=2)
    fig.add_hline(y=CARRIED_SHARE, line_dash="dot", row=2, col=1)
    fig.update_layout(title="The gateway's added latency, by server and workers", height=800)
    figures = [fig]
    if soaked is not None:
        mem = go.Figure()
        for pid, samples in soaked.samples.items():
            mem.add_trace(
                go.Scatter(x=[t for t, _ in samples], y=[rss / 2**20 for _, rss in samples],
                           name=f"pid {pid}", mode="lines")
            )  # fmt: skip
        mem.update_layout(
            title=f"RSS of the gateway's processes at {soaked.rate:g} req/s "
            f"({soaked.server}:{soaked.workers})",
            xaxis_title="seconds",
            yaxis_title="MiB",
        )
        figures.append(mem)
    body = "".join(
        f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figures)
    )
    import html

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>Gateway benchmark</title>"
        f"</head><body><pre>{html.escape(text)}</pre>{body}</body></html>"
    )


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
        f"(servers: {', '.join(SERVERS)})",
    )
    p.add_argument("--server", help="one server (with --workers): instead of --servers")
    p.add_argument("--workers", type=int, default=1, help="workers of --server")
    p.add_argument(
        "--rates",
        default="100,150,200,250,300,400,500",
        help="offered rates of the sweep, requests per second, comma-separated",
    )
    p.add_argument("--full-sweep", action="store_true",
                   help="measure every rate, also past the first one not carried")  # fmt: skip
    p.add_argument("--duration", type=float, default=10.0, help="seconds per rate")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measure every configuration this many times, interleaved; report the medians",
    )
    p.add_argument("--stream-rate", type=float, default=100.0,
                   help="rate of the streaming point (0: none)")  # fmt: skip
    p.add_argument("--arrivals", choices=["poisson", "fixed"], default="poisson")
    p.add_argument("--engine-speed", type=float, default=1000.0)
    p.add_argument("--bid", default="0.001", help="the gateway requests' bid, $/s")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds before a request fails")
    p.add_argument("--db-threads", type=int, default=None, help="the gateway's GATEWAY_DB_THREADS")
    p.add_argument(
        "--soak",
        metavar="SERVER:WORKERS",
        help="then run this configuration for --soak-s seconds and report its memory",
    )
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
    args.rates = sorted(float(r) for r in args.rates.split(",") if r.strip())
    if not args.rates or min(args.rates) <= 0 or args.duration <= 0 or args.repeat < 1:
        p.error("rates, duration and repeat must be positive")
    return args


def _json(
    runs: list[ServerRun], repeats: list[ServerRun], soaked: Soak | None, args: argparse.Namespace
) -> dict:
    def run_dict(run: ServerRun) -> dict:
        return {
            **asdict(run),
            "config": run.name,
            "sweep": [{**asdict(p), "carried": p.carried} for p in run.sweep],
        }

    return {
        "settings": {
            "duration_s": args.duration,
            "arrivals": args.arrivals,
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
    try:
        import uvloop

        uvloop.install()  # the load generator's own cost, kept small
    except ImportError:
        pass
    engine_port = free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    logs = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    engine = start(
        [sys.executable, "-m", "engines.sim.server", "--port", str(engine_port), "--speed",
         str(args.engine_speed), "--market", "gateway-bench", "--log-level", "WARNING"],
        log=logs / "engine.log",
    )  # fmt: skip
    floors = any(server == FLOOR and n for server, n in args.configs)
    try:
        key, model = setup_database(engine_url)
        if floors:
            floor_table(create=True)
        gateways = Gateways(logs, args.db_threads, engine_url)
        repeats, soaked = asyncio.run(measure(args, gateways, engine_url, key, model))
        runs = merged(repeats)
    finally:
        stop(engine)
        if floors:
            floor_table(create=False)
    text = (
        f"{args.duration:g} s per rate, medians of {args.repeat} interleaved repeat(s), "
        f"{args.arrivals} arrivals, engine speed "
        f"{args.engine_speed:g}, DEBUG off, GATEWAY_DB_THREADS={args.db_threads or 'default'}, "
        f"{os.cpu_count()} CPUs; latency: send to last byte (stream: to the first), ms; "
        f"carried: achieved >= {CARRIED_SHARE:g} x offered and added p99 <= "
        f"{CARRIED_ADDED_P99_MS:g} ms; logs in {logs}\n\n" + table(runs)
    )
    if soaked is not None:
        text += "\n\n" + soak_text(soaked)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(_json(runs, repeats, soaked, args), indent=2))
    if args.html:
        write_html(runs, soaked, Path(args.html), text)


if __name__ == "__main__":
    main()
