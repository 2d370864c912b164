"""``python -m benchmarks.gateway``: the gateway's added latency over the engine.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/market \\
        python -m benchmarks.gateway --rates 100,300 --duration 20

Starts the simulated engine (``--engine-speed``, default 1000: its own step times shrink to
microseconds) and the gateway (Daphne serving ``config.asgi``, one process) as subprocesses, on
the database of ``DATABASE_URL`` (migrated first), with a fresh tenant (an API key, a monthly
budget) and a market pointing at the engine. Then, for each rate, two open-loop arrival streams
run side by side for ``--duration`` seconds: one through the gateway (``POST
/v1/completions``), one straight to the engine (``POST /generate``), both at the rate, with
tiny prompts and ``max_tokens`` 1. Arrivals are Poisson (or ``--arrivals fixed``); each request
is sent at its time whatever the others are doing. Latency: from sending the request to having
read the whole answer, milliseconds. The report gives both distributions (p50, p95, p99), their
difference (the gateway's added latency) and the achieved rates. Not a test: figures depend on
the machine.
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
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]
WARMUP_REQUESTS = 300


@dataclass
class PathResult:
    """One arrival stream's outcome. Latencies in milliseconds, rates in requests per second."""

    sent: int
    ok: int
    errors: int
    achieved_rate: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float


@dataclass
class RatePoint:
    """Both streams at one target rate, and the gateway's added latency (gateway - direct)."""

    rate: float
    gateway: PathResult
    direct: PathResult
    added_p50_ms: float
    added_p95_ms: float
    added_p99_ms: float


def percentile(sorted_values: list[float], p: float) -> float:
    """The p-th percentile by the nearest-rank method (nan for no values)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, round(p / 100 * len(sorted_values) + 0.5 - 1e-9))
    return sorted_values[min(rank, len(sorted_values)) - 1]


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


def start(args: list[str], *, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A Python subprocess in the repository, its output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop(proc: subprocess.Popen) -> None:
    """Terminate a subprocess; kill it if it has not ended in 5 s (Daphne drains requests)."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


async def wait_ready(session: aiohttp.ClientSession, url: str, timeout_s: float = 30) -> None:
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


async def one(session: aiohttp.ClientSession, target: Target, body: dict) -> tuple[float, bool]:
    """Send one request; (milliseconds to the last byte, whether it was a 200)."""
    started = time.perf_counter()
    try:
        async with session.post(target.url, json=body, headers=target.headers) as response:
            await response.read()
            ok = response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        ok = False  # refused, reset, or past --timeout: an error
    return (time.perf_counter() - started) * 1000, ok


async def stream(
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
    latencies = sorted(ms for ms, ok in done if ok)
    ok = len(latencies)
    return PathResult(
        sent=len(done),
        ok=ok,
        errors=len(done) - ok,
        achieved_rate=ok / elapsed if elapsed > 0 else 0.0,
        p50_ms=percentile(latencies, 50),
        p95_ms=percentile(latencies, 95),
        p99_ms=percentile(latencies, 99),
        mean_ms=sum(latencies) / ok if ok else float("nan"),
    )


async def measure(args: argparse.Namespace, gateway: Target, direct: Target) -> list[RatePoint]:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await wait_ready(session, direct.url.replace("/generate", "/health"))
        await wait_ready(session, gateway.url.replace("/v1/completions", "/v1/models"))
        # Warm up both paths (connections, caches, the gateway's database threads).
        for i in range(WARMUP_REQUESTS):
            await one(session, gateway, gateway.body)
            await one(session, direct, {**direct.body, "rid": f"warm-{i}-{uuid.uuid4().hex}"})
        points = []
        for rate in args.rates:
            run = uuid.uuid4().hex[:8]
            common = {"rate": rate, "duration_s": args.duration, "arrivals": args.arrivals}
            gw, dr = await asyncio.gather(
                stream(session, gateway, seed=1, rid_prefix=f"g{run}", **common),
                stream(session, direct, seed=2, rid_prefix=f"d{run}", **common),
            )
            points.append(
                RatePoint(
                    rate=rate,
                    gateway=gw,
                    direct=dr,
                    added_p50_ms=gw.p50_ms - dr.p50_ms,
                    added_p95_ms=gw.p95_ms - dr.p95_ms,
                    added_p99_ms=gw.p99_ms - dr.p99_ms,
                )
            )
            await asyncio.sleep(1)
    return points


def table(points: list[RatePoint]) -> str:
    """The report as a Markdown table (milliseconds, requests per second)."""
    lines = [
        "| rate (req/s) | path | achieved (req/s) | ok | errors | p50 ms | p95 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        for name, r in (("engine direct", p.direct), ("gateway", p.gateway)):
            lines.append(
                f"| {p.rate:g} | {name} | {r.achieved_rate:.1f} | {r.ok} | {r.errors} | "
                f"{r.p50_ms:.2f} | {r.p95_ms:.2f} | {r.p99_ms:.2f} |"
            )
        lines.append(
            f"| {p.rate:g} | **added by the gateway** | | | | **{p.added_p50_ms:.2f}** | "
            f"**{p.added_p95_ms:.2f}** | **{p.added_p99_ms:.2f}** |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gateway",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rates", default="100,300", help="requests per second, comma-separated")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per rate")
    p.add_argument("--arrivals", choices=["poisson", "fixed"], default="poisson")
    p.add_argument("--engine-speed", type=float, default=1000.0)
    p.add_argument("--bid", default="0.001", help="the gateway requests' bid, $/s")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds before a request fails")
    p.add_argument("--db-threads", type=int, default=None, help="the gateway's GATEWAY_DB_THREADS")
    p.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    args = p.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if not args.rates or min(args.rates) <= 0 or args.duration <= 0:
        p.error("rates and duration must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    engine_port, gateway_port = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    logs = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    engine = start(
        ["-m", "engines.sim.server", "--port", str(engine_port), "--speed",
         str(args.engine_speed), "--market", "gateway-bench", "--log-level", "WARNING"],
        log=logs / "engine.log",
    )  # fmt: skip
    gateway_proc = None
    try:
        key, model = setup_database(engine_url)
        # As in production: DEBUG off (no query log), access log off.
        env = {"DEBUG": "0", "ALLOWED_HOSTS": "127.0.0.1",
               "SECRET_KEY": os.environ.get("SECRET_KEY") or uuid.uuid4().hex}  # fmt: skip
        if args.db_threads:
            env["GATEWAY_DB_THREADS"] = str(args.db_threads)
        gateway_proc = start(
            ["-m", "daphne", "-b", "127.0.0.1", "-p", str(gateway_port), "-v", "0",
             "config.asgi:application"],
            env=env,
            log=logs / "gateway.log",
        )  # fmt: skip
        gateway = Target(
            url=f"http://127.0.0.1:{gateway_port}/v1/completions",
            body={"model": model, "prompt": "Hi there", "max_tokens": 1, "bid": args.bid},
            headers={"Authorization": f"Bearer {key}"},
        )
        sampling = {"max_new_tokens": 1, "custom_params": {"bid": float(args.bid)}}
        direct = Target(
            url=f"{engine_url}/generate",
            body={"rid": "x", "text": "Hi there", "sampling_params": sampling},
            headers={},
        )
        points = asyncio.run(measure(args, gateway, direct))
    finally:
        for proc in (gateway_proc, engine):
            if proc is not None:
                stop(proc)
    print(
        f"{args.duration:g} s per rate, {args.arrivals} arrivals, engine speed "
        f"{args.engine_speed:g}, gateway: one Daphne process, DEBUG off, "
        f"GATEWAY_DB_THREADS={args.db_threads or 'default'}; latency: send to last "
        f"byte, ms; logs in {logs}\n"
    )
    print(table(points))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(p) for p in points], indent=2))


if __name__ == "__main__":
    main()
