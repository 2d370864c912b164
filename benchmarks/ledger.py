"""``python -m benchmarks.ledger``: the ledger's throughput and PostgreSQL's CPU per request, with
the gateway's batches of holds and settlements and without, beside the floor's plain inserts,
in one run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/market \\
        python -m benchmarks.ledger --writers 2 --rates 100,300,max --duration 5 \\
        --json var/bench/ledger.json --html var/bench/ledger.html

``--writers`` processes stand for as many gateway processes. Each runs an event loop with the
gateway's batches (``openai_api.gateway.batching``: on the loop's own connections, and its
database threads for what a batch's statement leaves), and carries its
share of the offered rate: an open-loop Poisson stream of requests (``max``: a closed loop,
``--concurrency`` requests in flight per writer, as many as PostgreSQL takes). A request is
held (the gateway's ``request_held``, in its batch of holds), waits ``--service-ms`` (the
engine), and is settled (the gateway's ``request_settled``: a token and a priority charge).
Three ways, one after the other at each rate, on one tenant and market made for the run:

- **floor**: two one-row inserts committed per request (one where the hold is, one where the
  settlement is), through one async connection per writer, as ``benchmarks.gateway_floor``
  does: what two round trips and commits cost here, with nothing of the ledger's work;
- **unbatched**: ``GATEWAY_LEDGER_BATCH_SIZE=1``, each hold and settlement a statement of its
  own;
- **batched**: the gateway's batches, of ``--batch SIZE:SECONDS,...`` (the settings' 64
  requests or 20 ms by default; each one a way of its own).

The ledger first holds a history (``--history``, 20,000 settled requests by default, written in
large batches for a tenant of their own), and its tables' statistics are refreshed before each
point, as autovacuum keeps them in a deployment that has been running. Without it, the first
points ran on nearly empty tables: PostgreSQL planned the prepared statements for them
(sequential scans) and kept those plans while the run added rows, so a point's CPU depended on
how many rows the points before it had left (the same batched point measured 0.88 to 2.07 ms a
request on new databases).

Reported per point: requests held and settled per second (achieved / offered), PostgreSQL's
CPU per settled request (user + system, psutil, of the cluster's processes: the backends
serving the writers, and all of them, WAL writer and checkpointer included; those started
during the point counted whole), the write-ahead log
the cluster wrote per settled request (bytes: the ledger's rows and their indexes, with none of
the CPU's noise), and the settle latency's p50 and p99 (from asking to the result: the batch's
wait included). Then the ledger check (``manage.py ledger_check``). Not a test: the figures
depend on the machine; the ratios to the floor in the same run are the point.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path

import plotly.graph_objects as go
import psutil

from benchmarks.html import Section, Table, command_line, write_json, write_page
from benchmarks.metrics import percentile
from benchmarks.progress import Progress

FLOOR, UNBATCHED = "floor", "unbatched"
MAX = "max"  # a closed loop instead of an offered rate
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Point:
    """One way at one rate, all writers together. Rates per second, CPU milliseconds, latency
    milliseconds."""

    mode: str
    offered: float | None  # requests per second; None: the closed loop
    seconds: float  # from the start to the last result
    held: int
    settled: int
    refused: int
    errors: int
    held_per_s: float
    settled_per_s: float
    pg_backends_cpu_ms: float  # per settled request: the backends serving the writers
    pg_cpu_ms: float  # per settled request: every process of the cluster
    wal_bytes: float  # per settled request: the WAL the cluster wrote
    settle_p50_ms: float
    settle_p99_ms: float
    hold_p50_ms: float
    hold_p99_ms: float


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "benchmarks-ledger")
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("set DATABASE_URL=postgres://... (the ledger's statements need PostgreSQL)")
    import django  # noqa: PLC0415

    django.setup()


def _world() -> dict[str, int]:
    """A tenant with a large monthly budget, its API key and a market, made for this run."""
    from accounts.services import api_key_create, budget_set, tenant_ensure  # noqa: PLC0415
    from market.models import Market  # noqa: PLC0415

    tag = uuid.uuid4().hex[:8]
    tenant = tenant_ensure(slug=f"ledger-{tag}", name=f"ledger benchmark {tag}")
    budget_set(tenant=tenant, limit=Decimal("1000000"), period="month")
    key, _ = api_key_create(tenant=tenant, name="bench", created_by=None)
    market = Market.objects.create(
        slug=f"ledger-{tag}", name="Ledger benchmark", served_model=f"bench/ledger-{tag}",
        engine_url="http://127.0.0.1:9", price_input_per_mtok=Decimal("3"),
        price_cached_input_per_mtok=Decimal("0.3"), price_output_per_mtok=Decimal("15"),
        reserve=Decimal("0"),
    )  # fmt: skip
    return {"tenant": tenant.pk, "key": key.pk, "market": market.pk}


HISTORY_BATCH = 500  # requests a statement while the history is written


def history_write(requests: int, progress: Progress) -> int:
    """Bring the ledger to at least ``requests`` requests, by settling new ones for a tenant of
    their own in large batches (the module's docstring says why). Returns how many it wrote."""
    from django.utils import timezone  # noqa: PLC0415

    from accounts.ledger import Open, PriorityCharge, ToSettle, Usage, ledger_store  # noqa: PLC0415
    from accounts.models import ApiKey, Request, Tenant  # noqa: PLC0415
    from market.models import Market  # noqa: PLC0415

    missing = requests - Request.objects.count()
    if missing <= 0:
        return 0
    world = _world()
    tenant, key = Tenant.objects.get(pk=world["tenant"]), ApiKey.objects.get(pk=world["key"])
    market = Market.objects.get(pk=world["market"])
    fields = {
        "market_id": market.pk, "bid": Decimal("0.01"), "priority_cap": Decimal("0.01"),
        "request_class": "", "bid_source": "explicit", "gateway": "history",
    }  # fmt: skip
    usage = Usage(prompt_tokens=120, cached_tokens=40, completion_tokens=16)
    charge = PriorityCharge(Decimal("0.0002"), "history:1", {"bid": 0.01, "position": 0})
    store, written = ledger_store(), 0
    progress.set_label(f"writing a history of {missing:,} requests")
    while written < missing:
        ids = [f"lh-{uuid.uuid4().hex}" for _ in range(min(HISTORY_BATCH, missing - written))]
        opened = store.requests_open(
            opens=[Open(tenant, key, i, Decimal("0.001"), fields) for i in ids], now=timezone.now()
        )
        if any(isinstance(o, Exception) for o in opened):
            raise RuntimeError(f"the history's requests were not all opened: {opened[:3]}")
        store.requests_settle(
            asks=[ToSettle(i, usage, Decimal("0.0005"), charge, market) for i in ids],
            now=timezone.now(),
        )
        written += len(ids)
    return written


def tables_analyzed() -> None:
    """Refresh PostgreSQL's statistics of the ledger's tables, as autovacuum keeps them in a
    running deployment (it would not within a point of a few seconds)."""
    from django.db import connection  # noqa: PLC0415

    with connection.cursor() as cursor:
        for table in ("accounts_request", "accounts_hold", "accounts_ledgerentry",
                      "accounts_budgetcounter", "accounts_budget"):  # fmt: skip
            cursor.execute(f"ANALYZE {table}")


def cluster_processes() -> list[psutil.Process]:
    """The PostgreSQL cluster's processes: the postmaster (its pid file in the data directory)
    and its children."""
    from django.db import connection  # noqa: PLC0415

    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('data_directory')")
        (data,) = cursor.fetchone()
    pid = int((Path(data) / "postmaster.pid").read_text().split()[0])
    root = psutil.Process(pid)
    return [root, *root.children()]


def _cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two readings of :func:`_cpu_s`: all of a process's that
    started between them; none of one that ended (its CPU went with it)."""
    return sum(s - before.get(pid, 0.0) for pid, s in after.items())


def _cpu_s(procs: list[psutil.Process]) -> dict[int, float]:
    seconds = {}
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            seconds[p.pid] = t.user + t.system
    return seconds


# --- a writer: one gateway process's ledger writes ---------------------------------------------


async def _writer(config: dict) -> dict:
    from accounts.ledger import PriorityCharge, Usage  # noqa: PLC0415
    from accounts.models import ApiKey, Tenant  # noqa: PLC0415
    from accounts.services import Opening, Served  # noqa: PLC0415
    from market.models import Market  # noqa: PLC0415
    from openai_api.gateway.admission import request_held  # noqa: PLC0415
    from openai_api.gateway.db import db_call  # noqa: PLC0415
    from openai_api.gateway.errors import BudgetExhaustedError  # noqa: PLC0415
    from openai_api.gateway.services import request_settled  # noqa: PLC0415

    world = config["world"]
    tenant, key, market = await db_call(
        lambda: (
            Tenant.objects.get(pk=world["tenant"]),
            ApiKey.objects.get(pk=world["key"]),
            Market.objects.get(pk=world["market"]),
        )
    )
    floor = config["floor"]
    db = None
    if floor:
        import psycopg  # noqa: PLC0415

        db = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True)
    usage = Usage(prompt_tokens=120, cached_tokens=40, completion_tokens=16)
    priority_detail = {"bid": 0.01, "effective_bid": 0.01, "time_saved_s": 0.01, "position": 0}
    holds_ms: list[float] = []
    settles_ms: list[float] = []
    counts = {"held": 0, "settled": 0, "refused": 0, "errors": 0}

    async def insert() -> None:
        from benchmarks.gateway_floor import _commit  # noqa: PLC0415

        assert db is not None
        await _commit(db, 1)

    async def one() -> None:
        rid = "lb-" + uuid.uuid4().hex
        started = time.perf_counter()
        try:
            if floor:
                await insert()
            else:
                await request_held(
                    Opening(
                        request_id=rid, tenant=tenant, api_key=key, market=market,
                        bid=Decimal("0.01"), hold_amount=Decimal("0.001"),
                        priority_cap=Decimal("0.01"), bid_source="explicit", gateway="bench",
                    )
                )  # fmt: skip
        except BudgetExhaustedError:
            counts["refused"] += 1
            return
        except Exception:  # noqa: BLE001 (counted: the report says how many)
            counts["errors"] += 1
            return
        held = time.perf_counter()
        holds_ms.append((held - started) * 1000)
        counts["held"] += 1
        await asyncio.sleep(config["service_s"])
        asked = time.perf_counter()
        try:
            if floor:
                await insert()
            else:
                charge = PriorityCharge(Decimal("0.0002"), "bench:1", priority_detail)
                await request_settled(Served(rid, usage, charge, market))
        except Exception:  # noqa: BLE001
            counts["errors"] += 1
            return
        settles_ms.append((time.perf_counter() - asked) * 1000)
        counts["settled"] += 1

    for _ in range(3):  # warm: connections open, statements prepared
        await one()
    holds_ms.clear()
    settles_ms.clear()
    counts.update(held=0, settled=0, refused=0, errors=0)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start = time.perf_counter()
    await _arrivals(one, config, start=start)
    seconds = time.perf_counter() - start
    result = {**counts, "seconds": seconds, "holds_ms": holds_ms, "settles_ms": settles_ms}
    print(json.dumps(result), flush=True)
    # Connections stay open until the CPU is read: a backend that exited takes its CPU along.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if db is not None:
        await db.close()
    return result


async def _arrivals(one, config: dict, *, start: float) -> None:  # type: ignore[no-untyped-def]
    """Run ``one()`` per arrival for the run's duration: Poisson at the writer's rate, or a
    closed loop of ``concurrency`` (rate None); then wait for the requests still running."""
    end = start + config["duration_s"]
    if config["rate"] is None:

        async def loop_one() -> None:
            while time.perf_counter() < end:
                await one()

        await asyncio.gather(*(loop_one() for _ in range(config["concurrency"])))
        return
    rng = random.Random(config["seed"])
    tasks: set[asyncio.Task] = set()
    at = start
    while True:
        at += rng.expovariate(config["rate"])
        if at >= end:
            break
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        task = asyncio.get_running_loop().create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(list(tasks))


def writer_main(config_json: str) -> None:
    config = json.loads(config_json)
    _setup()
    asyncio.run(_writer(config))


# --- the run ---------------------------------------------------------------------------------


def run_point(
    *, mode: str, rate: float | None, args: argparse.Namespace, world: dict, seed: int
) -> Point:
    size, interval = args.batches.get(mode, (1, 0.0))
    env = {"GATEWAY_LEDGER_BATCH_SIZE": str(size), "GATEWAY_LEDGER_BATCH_S": str(interval)}
    config = {
        "world": world, "floor": mode == FLOOR, "service_s": args.service_ms / 1000,
        "duration_s": args.duration, "concurrency": args.concurrency,
        "rate": None if rate is None else rate / args.writers,
    }  # fmt: skip
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.ledger",
                "--writer",
                json.dumps({**config, "seed": seed * 100 + w}),
            ],
            cwd=REPO,
            env={**os.environ, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for w in range(args.writers)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a {mode} writer did not start")
        cluster = cluster_processes()
        backends = [p for p in cluster if _serves(p)]
        before_all, before_backends = _cpu_s(cluster), _cpu_s(backends)
        wal_before = _wal_at()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            assert p.stdout is not None
            results.append(json.loads(p.stdout.readline()))
        # The processes of the cluster now, those started during the point included: a writer
        # may connect again under load (a gateway's database threads connect when first used).
        cluster = cluster_processes()
        after_all = _cpu_s(cluster)
        after_backends = _cpu_s([p for p in cluster if _serves(p)])
        wal = _wal_at() - wal_before
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("bye\n")
            p.stdin.flush()
    finally:
        for p in procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=30)
            if p.poll() is None:
                p.kill()
    cpu_all = _cpu_spent(before_all, after_all)
    cpu_backends = _cpu_spent(before_backends, after_backends)
    settled = sum(r["settled"] for r in results)
    seconds = max(r["seconds"] for r in results)
    per = (lambda cpu: cpu * 1000 / settled) if settled else (lambda cpu: math.nan)
    settles = [x for r in results for x in r["settles_ms"]]
    holds = [x for r in results for x in r["holds_ms"]]
    return Point(
        mode=mode, offered=rate, seconds=seconds,
        held=sum(r["held"] for r in results), settled=settled,
        refused=sum(r["refused"] for r in results), errors=sum(r["errors"] for r in results),
        held_per_s=sum(r["held"] for r in results) / seconds, settled_per_s=settled / seconds,
        pg_backends_cpu_ms=per(cpu_backends), pg_cpu_ms=per(cpu_all),
        wal_bytes=wal / settled if settled else math.nan,
        settle_p50_ms=percentile(settles, 50), settle_p99_ms=percentile(settles, 99),
        hold_p50_ms=percentile(holds, 50), hold_p99_ms=percentile(holds, 99),
    )  # fmt: skip


def _wal_at() -> int:
    """Where the cluster's write-ahead log ends now, in bytes."""
    from django.db import connection  # noqa: PLC0415

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def _serves(p: psutil.Process) -> bool:
    """Whether a cluster process is a backend serving a client (its title names a client)."""
    with contextlib.suppress(psutil.Error):
        title = " ".join(p.cmdline())
        return "(" in title and "postgres:" in title
    return False


def _rate(value: float | None) -> str:
    return MAX if value is None else f"{value:g}"


def table(points: list[Point]) -> Table:
    floors = {p.offered: p for p in points if p.mode == FLOOR}
    rows = []
    for p in points:
        floor = floors.get(p.offered)
        ratio = p.pg_cpu_ms / floor.pg_cpu_ms if floor and floor.pg_cpu_ms else math.nan
        achieved = "" if p.offered is None else f"{p.settled_per_s / p.offered:.2f}"
        rows.append((
            p.mode, _rate(p.offered), f"{p.held_per_s:.0f}", f"{p.settled_per_s:.0f}", achieved,
            f"{p.pg_backends_cpu_ms:.3f}", f"{p.pg_cpu_ms:.3f}", f"{ratio:.2f}",
            f"{p.wal_bytes:,.0f}",
            f"{p.settle_p50_ms:.1f}", f"{p.settle_p99_ms:.1f}", f"{p.hold_p99_ms:.1f}",
            p.refused + p.errors,
        ))  # fmt: skip
    return Table(
        columns=(
            "way",
            "offered (req/s)",
            "held (req/s)",
            "settled (req/s)",
            "achieved / offered",
            "PostgreSQL backends CPU (ms/request)",
            "PostgreSQL CPU (ms/request)",
            "CPU / floor's",
            "WAL (bytes/request)",
            "settle p50 (ms)",
            "settle p99 (ms)",
            "hold p99 (ms)",
            "refused or failed",
        ),
        rows=rows,
    )


def figures(points: list[Point]) -> list[go.Figure]:
    rates = sorted({_rate(p.offered) for p in points}, key=lambda r: (r == MAX, r))
    cpu, throughput = go.Figure(), go.Figure()
    for mode in dict.fromkeys(p.mode for p in points):
        mine = {_rate(p.offered): p for p in points if p.mode == mode}
        xs = [r for r in rates if r in mine]
        cpu.add_bar(name=mode, x=xs, y=[mine[r].pg_cpu_ms for r in xs])
        throughput.add_bar(name=mode, x=xs, y=[mine[r].settled_per_s for r in xs])
    cpu.update_layout(
        title="PostgreSQL CPU per held and settled request", barmode="group",
        xaxis_title="offered rate (req/s; max: closed loop)", yaxis_title="CPU (ms/request)",
    )  # fmt: skip
    throughput.update_layout(
        title="Requests settled per second", barmode="group",
        xaxis_title="offered rate (req/s; max: closed loop)", yaxis_title="settled (req/s)",
    )  # fmt: skip
    return [cpu, throughput]


def _ledger_check() -> str:
    from io import StringIO  # noqa: PLC0415

    from django.core.management import call_command  # noqa: PLC0415
    from django.core.management.base import CommandError  # noqa: PLC0415

    out = StringIO()
    try:
        call_command("ledger_check", "--grace", "60", stdout=out)
    except CommandError as exc:
        return out.getvalue() + f"\n{exc}"
    return out.getvalue()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ledger", description=__doc__)
    parser.add_argument("--writers", type=int, default=2, help="gateway processes (2)")
    parser.add_argument(
        "--rates", default="100,300,max", help="offered req/s, all writers together; max: a "
        "closed loop (100,300,max)",
    )  # fmt: skip
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per point (5)")
    parser.add_argument(
        "--concurrency", type=int, default=32, help="requests in flight per writer in the "
        "closed loop (32)",
    )  # fmt: skip
    parser.add_argument(
        "--service-ms", type=float, default=5.0, help="ms between a hold and its settlement (5)"
    )
    parser.add_argument(
        "--batch", default="64:0.02", help="the batched ways, SIZE:SECONDS,... (64:0.02)"
    )
    parser.add_argument(
        "--history", type=int, default=20_000, help="settled requests the ledger holds before "
        "the first point, written first if it has fewer (20000)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--html", help="write the Plotly report here")
    parser.add_argument("--no-progress", action="store_true", help="no progress line")
    args = parser.parse_args(argv)
    args.batches = {}
    for way in args.batch.split(","):
        size, seconds = way.split(":")
        args.batches[f"batched {size} / {float(seconds) * 1000:g} ms"] = (int(size), float(seconds))
    args.rates = [None if r == MAX else float(r) for r in args.rates.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--writer":
        writer_main(sys.argv[2])
        return
    args = parse_args(argv)
    _setup()
    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connections  # noqa: PLC0415

    from benchmarks.gateway import floor_table  # noqa: PLC0415

    call_command("migrate", verbosity=0)
    world = _world()
    floor_table(True)
    todo = [(rate, mode) for rate in args.rates for mode in (FLOOR, UNBATCHED, *args.batches)]
    progress = Progress(len(todo), enabled=not args.no_progress)
    points = []
    try:
        history_write(args.history, progress)
        for rate, mode in todo:
            tables_analyzed()
            progress.set_label(f"{mode} at {_rate(rate)} req/s")
            progress.advance(0)
            # Every way at a rate gets the same arrivals.
            seed = args.seed + args.rates.index(rate)
            point = run_point(mode=mode, rate=rate, args=args, world=world, seed=seed)
            points.append(point)
            progress.advance()
            connections.close_all()
    finally:
        progress.close()
        floor_table(False)
    check = _ledger_check()
    result = table(points)
    text = (
        f"{args.writers} writers, {args.duration:g} s a point, {args.service_ms:g} ms from a "
        f"hold to its settlement, {os.cpu_count()} CPUs\n\n{result.text()}\n\n"
        f"ledger check:\n{check}"
    )
    print(text)
    if args.json:
        write_json(args.json, {
            "command": command_line("benchmarks.ledger", argv),
            "writers": args.writers, "duration_s": args.duration, "service_ms": args.service_ms,
            "batches": args.batches, "cpus": os.cpu_count(),
            "points": [asdict(p) for p in points], "ledger_check": check,
        })  # fmt: skip
    if args.html:
        write_page(
            args.html,
            "Ledger throughput: batched settlements, unbatched, and the floor",
            [Section("Figures", text=text, tables=[result], figures=figures(points))],
            command=command_line("benchmarks.ledger", argv),
        )


if __name__ == "__main__":
    main()
