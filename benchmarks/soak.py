"""The soak: the live market under the demo's load for a long while, one fault every few minutes,
then the ledger check.

    DATABASE_URL=postgres://... REDIS_URL=redis://... \\
        python -m benchmarks.soak [--minutes 30] [--fault-every 180] [--var var/soak]

It runs ``manage.py live_market`` (two simulated replicas behind the router, uvicorn with two
workers, a Celery worker and beat, the bidding agents) with its PostgreSQL and Redis reached
through TCP proxies (``benchmarks.faults``), and injects, in turn:

- ``replica``: SIGKILL of the first replica (supervisord starts it again);
- ``router``: SIGKILL of the router (every request fails until it is back: 503);
- ``worker``: SIGKILL of the Celery worker (round records and periodic work wait for it);
- ``redis``: Redis unreachable for ``--redis-down`` seconds (30);
- ``postgres``: PostgreSQL unreachable for ``--postgres-down`` seconds (15);
- ``postgres-cut``: every PostgreSQL connection cut at once (a failover).

At the end it stops the market (SIGTERM: the gateway releases what it holds), runs the ledger
check (``accounts.selectors.ledger_check``) on the database, prints the gateway's answers by
status and the check, and writes them to ``<var>/soak.json``. It exits 1 when the check fails.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.faults import TcpProxy, via
from benchmarks.html import write_json

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ("replica", "router", "worker", "redis", "postgres", "postgres-cut")
METRICS_TOKEN = "soak-metrics"


def _proxy_to(url: str, default_port: int) -> TcpProxy:
    parts = urllib.parse.urlsplit(url)
    return TcpProxy((parts.hostname or "127.0.0.1", parts.port or default_port)).start()


class Market:
    """``manage.py live_market`` in a subprocess, its output kept and read for children's pids."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log.open("w")
        self.lines: list[str] = []
        self.pids: dict[str, int] = {}
        self._up = threading.Event()
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            self.lines.append(line.rstrip("\n"))
            if found := re.search(r"spawned: '(\S+)' with pid (\d+)", line):  # supervisord
                self.pids[found[1]] = int(found[2])
            if "Ctrl-C stops everything" in line:
                self._up.set()

    def wait_up(self, timeout_s: float = 180.0) -> None:
        if not self._up.wait(timeout_s):
            raise SystemExit(f"the live market did not come up; see {self.log.name}")

    def kill(self, child: str) -> str:
        pid = self.pids.get(child)
        if pid is None:
            return f"no {child} to kill"
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return f"{child} (pid {pid}) was already gone"
        return f"SIGKILL to {child} (pid {pid})"

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            self.log.close()


def _answers(base: str) -> Counter[str]:
    """The gateway's answers so far by HTTP status (its Prometheus counter, summed)."""
    request = urllib.request.Request(
        f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
    )
    counts: Counter[str] = Counter()
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            text = reply.read().decode()
    except OSError:
        return counts
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gateway_requests_total" and "status" in sample.labels:
                counts[sample.labels["status"]] += int(sample.value)
    return counts


def _faults(
    market: Market, pg: TcpProxy, redis_proxy: TcpProxy, opts: argparse.Namespace
) -> dict[str, Callable[[], str]]:
    def down_for(proxy: TcpProxy, name: str, seconds: float) -> Callable[[], str]:
        def run() -> str:
            proxy.down()
            time.sleep(seconds)
            proxy.up()
            return f"{name} unreachable for {seconds:g} s"

        return run

    def cut() -> str:
        pg.cut()
        return "every PostgreSQL connection cut"

    return {
        "replica": lambda: market.kill("engine-1"),
        "router": lambda: market.kill("router"),
        "worker": lambda: market.kill("worker"),
        "redis": down_for(redis_proxy, "Redis", opts.redis_down),
        "postgres": down_for(pg, "PostgreSQL", opts.postgres_down),
        "postgres-cut": cut,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.soak", description=__doc__.split("\n")[0]
    )
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--fault-every", type=float, default=180.0, metavar="SECONDS")
    p.add_argument("--redis-down", type=float, default=30.0, metavar="SECONDS")
    p.add_argument("--postgres-down", type=float, default=15.0, metavar="SECONDS")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--engine-port", type=int, default=30100)
    p.add_argument("--var", type=Path, default=ROOT / "var" / "soak")
    opts = p.parse_args(argv)
    database_url, redis_url = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
    if not (database_url or "").startswith("postgres") or not redis_url:
        p.error("set DATABASE_URL (PostgreSQL) and REDIS_URL: the soak injects faults into both")
    opts.var.mkdir(parents=True, exist_ok=True)
    manage = [sys.executable, str(ROOT / "manage.py")]
    for step in (["migrate", "--noinput"], ["seed_demo"]):  # as `make run` does first
        subprocess.run([*manage, *step], cwd=ROOT, check=True, capture_output=True)
    pg, redis_proxy = _proxy_to(database_url, 5432), _proxy_to(redis_url, 6379)
    env = {
        **os.environ,
        "DATABASE_URL": via(database_url, pg),
        "REDIS_URL": via(redis_url, redis_proxy),
        "METRICS_TOKEN": METRICS_TOKEN,
    }
    base = f"http://127.0.0.1:{opts.port}"
    market = Market(
        [*manage, "live_market", "--port", str(opts.port), "--engine-port",
         str(opts.engine_port), "--var", str(opts.var)],
        env, opts.var / "live_market.log",
    )  # fmt: skip
    injected: list[dict[str, object]] = []
    try:
        market.wait_up()
        faults = _faults(market, pg, redis_proxy, opts)
        start = time.monotonic()
        end = start + opts.minutes * 60
        n = 0
        while (next_at := start + (n + 1) * opts.fault_every) < end:
            time.sleep(max(0.0, next_at - time.monotonic()))
            name = FAULTS[n % len(FAULTS)]
            what = faults[name]()
            at_s = time.monotonic() - start
            injected.append({"at_s": round(at_s, 1), "fault": name, "what": what})
            print(f"[{at_s / 60:5.1f} min] {what}; answers so far {dict(_answers(base))}",
                  flush=True)  # fmt: skip
            n += 1
        time.sleep(max(0.0, end - time.monotonic()))
        answers = _answers(base)
    finally:
        code = market.stop()
        pg.close()
        redis_proxy.close()
    # The check reads the database directly, not through the proxy.
    import django  # noqa: PLC0415 - Django only for the check, after the market stopped

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.conf import settings  # noqa: PLC0415

    from accounts.selectors.ledger_check import ledger_check  # noqa: PLC0415

    check = ledger_check(grace_s=settings.STALE_REQUEST_S)
    restarts = Counter(
        found[1] for line in market.lines if (found := re.search(r"exited: (\S+) ", line))
    )
    summary = {
        "minutes": opts.minutes,
        "faults": injected,
        "answers_by_status": dict(sorted(answers.items())),
        "restarts": dict(restarts),
        "live_market_exit": code,
        "ledger_check": check.lines(),
        "ok": check.ok,
    }
    write_json(opts.var / "soak.json", summary)
    print(f"answers by status: {summary['answers_by_status']}; restarts: {dict(restarts)}")
    print("\n".join(check.lines()))
    return 0 if check.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
