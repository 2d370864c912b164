"""The README's main command's last step: ``manage.py live_market`` runs the whole market.

Each test runs it in a subprocess on the embedded defaults (no Redis) with a SQLite file of its
own, copied from one migrated and seeded once per module (with a tenant ``load`` of our own:
its API key, a large budget and an autobidder).
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import psutil
import pytest
import redis

from engines.contract.wire import ADMIN_TOKEN_ENV
from tests.conftest import REPO_ROOT, dead_port

MANAGE = [sys.executable, str(REPO_ROOT / "manage.py")]
MODEL = "demo/tiny-llm"  # the demo market's (market.services.DEMO_MARKET)
LOAD_TENANT = """
from accounts.models import Tenant
from accounts.services import api_key_create, budget_set
from accounts.services.autobidder import autobidder_configure
tenant = Tenant.objects.create(name="Load", slug="load")
budget_set(tenant=tenant, limit="1000000", period="month")
autobidder_configure(tenant=tenant, enabled=True, budget="100000", period="day",
                     values={"interactive": "0.05", "background": "0.005"}, max_wait_s=30.0)
print("KEY", api_key_create(tenant=tenant, name="load test", created_by=None)[1])
"""


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return reply.read()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _embedded_env(db: Path, **extra: str) -> dict[str, str]:
    """The embedded defaults (no Redis) and no engine admin token: ``live_market`` makes its
    own, as ``make run`` on a fresh machine does."""
    unset = ("DATABASE_URL", "REDIS_URL", ADMIN_TOKEN_ENV)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    return {**env, "DATABASE_URL": f"sqlite:///{db}", **extra}


def _redis_of_its_own() -> str:
    """A Redis database for a live market with Redis: the tests' server, database 14, emptied
    (its Celery worker must not take other tests' tasks, nor they its)."""
    from django.conf import settings

    url = urllib.parse.urlsplit(settings.REDIS_URL)
    own = urllib.parse.urlunsplit(url._replace(path="/14"))
    redis.Redis.from_url(own).flushdb()
    return own


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> tuple[Path, str]:
    """A migrated, seeded SQLite file (not to be written: copy it) and the ``load`` key."""
    db = tmp_path_factory.mktemp("live") / "seeded.sqlite3"
    env = _embedded_env(db)
    for step in (["migrate", "--noinput"], ["seed_demo"], ["shell", "-c", LOAD_TENANT]):
        done = subprocess.run(
            [*MANAGE, *step], env=env, check=True, capture_output=True, text=True, timeout=120
        )
    (key,) = re.findall(r"^KEY (\S+)$", done.stdout, flags=re.MULTILINE)
    return db, key


class LiveMarket:
    """``manage.py live_market`` in a subprocess; its output read by a thread, line by line."""

    def __init__(self, tmp_path: Path, seeded_db: Path, *args: str, **env: str) -> None:
        db = tmp_path / "live.sqlite3"
        shutil.copy(seeded_db, db)
        self.web, self.engine = dead_port(), dead_port()
        # With replicas (the default: two behind the gateway), they listen on the next ports.
        replicas = int(args[args.index("--replicas") + 1]) if "--replicas" in args else 2
        self.replica_ports = (
            [self.engine + i for i in range(1, replicas + 1)] if replicas > 1 else []
        )
        self.base = f"http://127.0.0.1:{self.web}"
        self.var = tmp_path / "var"
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            [*MANAGE, "live_market", "--port", str(self.web), "--engine-port", str(self.engine),
             "--var", str(self.var), *args],
            env=_embedded_env(db, **env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.lines.append("<exited>")
            self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def wait_line(self, pattern: str, *, after: int = 0, timeout_s: float = 90.0) -> re.Match:
        """The first line from index ``after`` on that matches ``pattern``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for line in self.lines[after:]:
                    if found := re.search(pattern, line):
                        return found
                assert "<exited>" not in self.lines, f"live_market exited:\n{self.output}"
                left = deadline - time.monotonic()
                assert left > 0, f"no line matching {pattern!r} in:\n{self.output}"
                self._changed.wait(left)

    def pid_of(self, name: str, *, after: int = 0) -> int:
        return int(self.wait_line(rf"\] {name}: started.* \(pid (\d+)\)", after=after)[1])

    def up(self) -> LiveMarket:
        self.wait_line("Ctrl-C stops everything")
        return self

    def stop(self) -> None:
        """SIGTERM, as Ctrl-C; then every child must have closed its port."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        ports = [self.web, self.engine, *self.replica_ports]
        stopped = time.monotonic() + 15
        while any(_listening(p) for p in ports) and time.monotonic() < stopped:
            time.sleep(0.1)
        assert not any(_listening(p) for p in ports), "children left behind"


def _chat(base: str, key: str, i: int, *, bid: float | None) -> tuple[int, dict]:
    """One chat completion through the gateway: (status, JSON body)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"topic {i % 5}: " + "tell me more " * (i % 4)}],
        "max_tokens": 4,
        **({"bid": bid} if bid is not None else {}),
    }
    request = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def test_live_market_serves_bidding_agents_and_stops_cleanly(tmp_path, seeded):
    market = LiveMarket(tmp_path, seeded[0], "--sessions-per-minute", "240")
    try:
        market.up()
        banner = market.output
        assert f"{market.base}/console/" in banner and "operator-demo-pass" in banner
        assert "SGLang's model gateway (smg) in front of 2 simulated replicas" in banner
        assert json.loads(_get(f"{market.base}/healthz"))["status"] == "ok"
        # The entry point is the gateway, with both replicas healthy behind it.
        workers = json.loads(_get(f"http://127.0.0.1:{market.engine}/workers"))["workers"]
        assert sorted(w["url"] for w in workers if w["is_healthy"]) == [
            f"http://127.0.0.1:{p}" for p in market.replica_ports
        ]
        for port in market.replica_ports:
            assert _get(f"http://127.0.0.1:{port}/health") == b""
        # The agents' requests go through the gateway and smg, and each replica records
        # the rounds it ran (its own file, followed by the web process).
        files = [market.var / f"rounds-sim-{i}.jsonl" for i in (1, 2)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
            f.exists() and f.stat().st_size for f in files
        ):
            time.sleep(0.5)
        assert all(f.exists() and f.stat().st_size > 0 for f in files), "a replica ran no round"
    finally:
        market.stop()


def test_a_killed_replica_is_routed_around_and_restarted(tmp_path, seeded):
    db, key = seeded
    market = LiveMarket(tmp_path, db, "--no-agents", "--restart-delay", "3")
    try:
        market.up()
        victim = market.pid_of("engine-1")
        assert _chat(market.base, key, 0, bid=0.01)[0] == 200
        seen = len(market.lines)
        os.kill(victim, signal.SIGKILL)
        while _listening(market.replica_ports[0]):
            time.sleep(0.05)
        # smg sends the market's requests to the replica left: the tenant sees no error.
        statuses = [_chat(market.base, key, i, bid=0.01)[0] for i in range(1, 7)]
        assert statuses == [200] * 6, statuses
        market.wait_line(r"engine-1: exited \(signal 9 \(SIGKILL\)\)", after=seen)
        assert market.pid_of("engine-1", after=seen) != victim
        deadline = time.monotonic() + 30
        while not _listening(market.replica_ports[0]):
            assert time.monotonic() < deadline, "the replica was not started again"
            time.sleep(0.2)
        assert _get(f"http://127.0.0.1:{market.replica_ports[0]}/health") == b""
    finally:
        market.stop()


def test_a_killed_engine_is_restarted_and_the_gateway_answers_503_meanwhile(tmp_path, seeded):
    db, key = seeded
    # A first delay of 3 s keeps the engine down long enough to be seen down.
    market = LiveMarket(tmp_path, db, "--no-agents", "--restart-delay", "3", "--replicas", "1")
    try:
        market.up()
        engine_pid, web_pid = market.pid_of("engine"), market.pid_of("web")
        assert _chat(market.base, key, 0, bid=0.01)[0] == 200
        seen = len(market.lines)
        os.kill(engine_pid, signal.SIGKILL)
        while _listening(market.engine):  # the kernel closes its port as it dies
            time.sleep(0.05)
        status, body = _chat(market.base, key, 1, bid=0.01)
        assert status == 503, body  # not a refused connection: the gateway is still there
        assert body["error"]["code"] == "engine_unavailable"
        market.wait_line(
            r"engine: exited \(signal 9 \(SIGKILL\)\) .*starting it again in 3 s", after=seen
        )
        new_pid = market.pid_of("engine", after=seen)
        assert new_pid != engine_pid
        deadline = time.monotonic() + 30
        while (status := _chat(market.base, key, 2, bid=0.01)[0]) != 200:
            assert status == 503 and time.monotonic() < deadline, status
            time.sleep(0.2)
        assert json.loads(_get(f"{market.base}/healthz"))["status"] == "ok"
        # The web server served throughout: it was never restarted.
        assert market.pid_of("web") == web_pid and "web: exited" not in market.output
        assert "web: started again" not in market.output
    finally:
        market.stop()


def test_embedded_sqlite_answers_concurrent_requests_while_settling_without_5xx(tmp_path, seeded):
    """The gateway's database thread, the round-record follower, the periodic tick (all in the
    web process) and the pacing steps (in live_market's, every 0.1 s here) write one SQLite
    file at once: every request must still be served (no "database is locked" 500)."""
    db, key = seeded
    market = LiveMarket(tmp_path, db, "--no-agents", "--replicas", "1", AUTOBID_INTERVAL_S="0.1")
    n = 240
    try:
        market.up()
        # Half with explicit bids over the reserve (priority charges settled by the gateway from
        # the engine's answers), half through the autobidder; 16 at a time.
        bids = [None if i % 2 else 0.002 * (1 + i % 5) for i in range(n)]
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda i: _chat(market.base, key, i, bid=bids[i]), range(n)))
        statuses = collections.Counter(status for status, _ in answers)
        errors = [body for status, body in answers if status != 200][:3]
        assert statuses == {200: n}, (statuses, errors)
        assert {body["auction"]["bid_source"] for _, body in answers} == {"explicit", "autobid"}
        # The follower took the engine's round records meanwhile (they move no money), and never
        # stalled on a locked database.
        rounds = market.var / "rounds.jsonl"
        offset = rounds.with_name(rounds.name + ".offset")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
            offset.exists() and json.loads(offset.read_text())["offset"] == rounds.stat().st_size
        ):
            time.sleep(0.2)
        assert json.loads(offset.read_text())["offset"] == rounds.stat().st_size > 0
    finally:
        market.stop()
    logs = (market.var / "logs" / "web.log").read_text()
    assert "database is locked" not in logs
    assert "unexpected error" not in logs


@pytest.mark.redis
def test_a_killed_web_server_leaves_no_workers_behind(tmp_path, seeded):
    """uvicorn's main process SIGKILLed (with Redis: two workers): its workers, orphaned, held
    the port, so the restarted server exited 3 ("address already in use") for ever. The
    supervisor stops what the server left before starting it again, and on stopping."""
    db, key = seeded
    market = LiveMarket(
        tmp_path, db, "--no-agents", "--replicas", "1", "--restart-delay", "0.5",
        REDIS_URL=_redis_of_its_own(),
    )  # fmt: skip
    try:
        market.up()
        assert "PostgreSQL/Redis + Celery worker" in market.output
        web = market.pid_of("web")
        left = [p.pid for p in psutil.Process(web).children(recursive=True)]
        assert len(left) >= 2, "uvicorn runs two workers"
        seen = len(market.lines)
        os.kill(web, signal.SIGKILL)
        market.wait_line(r"web: exited \(signal 9 \(SIGKILL\)\)", after=seen)
        again = market.pid_of("web", after=seen)
        assert again != web
        assert not [pid for pid in left if _running(pid)], "the old workers outlived their server"
        deadline = time.monotonic() + 60
        while True:
            try:
                if json.loads(_get(f"{market.base}/healthz"))["status"] == "ok":
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, market.output
            time.sleep(0.2)
        assert _chat(market.base, key, 0, bid=0.01)[0] == 200
        # The restarted server is the one serving, and it stays up.
        time.sleep(3)
        assert _running(again) and "web: exited" not in "\n".join(market.lines[seen:]).replace(
            "web: exited (signal 9 (SIGKILL))", ""
        ), market.output
        children = [p.pid for p in psutil.Process(again).children(recursive=True)]
    finally:
        market.stop()
    assert not [pid for pid in children if _running(pid)], "workers left after the stop"


def test_the_engines_control_is_closed_to_whoever_lacks_the_runs_token(tmp_path, seeded):
    """With no ENGINE_ADMIN_TOKEN set, ``live_market`` makes one for its run: the engine asks
    for it, the web server (which pushes the console's changes) holds it, and a POST to the
    engine's control path without it changes nothing."""
    db, key = seeded
    market = LiveMarket(tmp_path, db, "--no-agents", "--replicas", "1")
    try:
        market.up()
        engine, web = market.pid_of("engine"), market.pid_of("web")
        token = _environ(engine).get(ADMIN_TOKEN_ENV, "")
        assert len(token) >= 32 and _environ(web).get(ADMIN_TOKEN_ENV) == token
        control = f"http://127.0.0.1:{market.engine}/admin/market"
        info = json.loads(_get(f"http://127.0.0.1:{market.engine}/get_model_info"))
        before = (info["policy"], info["reserve"])
        for auth in ({}, {"Authorization": "Bearer guess"}):
            request = urllib.request.Request(
                control,
                data=json.dumps({"policy": "fcfs", "reserve": 1e6}).encode(),
                headers={"Content-Type": "application/json", **auth},
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=5)
            assert refused.value.code == 401
        info = json.loads(_get(f"http://127.0.0.1:{market.engine}/get_model_info"))
        assert (info["policy"], info["reserve"]) == before != ("fcfs", 1e6)
        status, body = _chat(market.base, key, 0, bid=0.01)
        assert status == 200 and float(body["auction"]["reserve"]) == before[1]
    finally:
        market.stop()


def _live_market_now(tmp_path: Path, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``live_market`` run to its end (it must end at once: it is to start nothing)."""
    return subprocess.run(
        [*MANAGE, "live_market", "--no-agents", "--var", str(tmp_path / "var-b"), *args],
        env=_embedded_env(db), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_second_live_market_on_taken_ports_stops_at_once_naming_the_port(tmp_path, seeded):
    """What ``make run`` twice on one machine did: the second printed "running", restarted its
    children for ever, and pushed its control to the first one's engines. Now it stops before
    starting anything, naming the busy port and the option (and ``make run`` variable) that
    moves it."""
    first = LiveMarket(tmp_path, seeded[0], "--no-agents")
    try:
        first.up()
        pids = {name: first.pid_of(name) for name in ("engine-1", "engine-2", "router", "web")}
        db = tmp_path / "second.sqlite3"
        shutil.copy(seeded[0], db)
        cases = [  # (web port, engine port): the port named, the option named
            ((first.web, dead_port()), first.web, "--port (make run PORT=...)"),
            ((dead_port(), first.engine), first.engine, "--engine-port (make run ENGINE_PORT=...)"),
            # Its replicas would take the first market's entry point and its first replica.
            ((dead_port(), first.engine - 1), first.engine, "--engine-port"),
        ]
        for (web, engine), busy, option in cases:
            began = time.monotonic()
            done = _live_market_now(tmp_path, db, "--port", str(web), "--engine-port", str(engine))
            took = time.monotonic() - began
            assert done.returncode == 1, done
            assert f"port {busy} (" in done.stderr and "is in use" in done.stderr, done.stderr
            assert option in done.stderr, done.stderr
            assert "started" not in done.stdout and "running" not in done.stdout, done.stdout
            assert took < 30, took  # a Django start and a few binds: no child was waited for
            # `make run` checks first: the same answer, before migrating or seeding.
            checked = _live_market_now(
                tmp_path, db, "--check-ports", "--port", str(web), "--engine-port", str(engine)
            )
            assert checked.returncode == 1 and f"port {busy} (" in checked.stderr
        # The first market never noticed: the same children, no restart.
        assert {name: first.pid_of(name) for name in pids} == pids
        assert "exited" not in first.output
        assert not (tmp_path / "var-b" / "logs" / "engine-1.log").exists()
    finally:
        first.stop()
    free = _live_market_now(tmp_path, db, "--check-ports", "--port", str(dead_port()))
    assert free.returncode == 0 and free.stderr == "", free


SECOND_MARKET = """
from market.models import Market, Replica
market = Market.objects.get(slug="demo-llm")
Market.objects.filter(pk=market.pk).update(reserve="0.004200000", policy="fcfs")
# As an earlier run left them: the replicas' addresses are now the first market's engines.
for i, url in enumerate(%r, start=1):
    Replica.objects.create(market=market, engine_id=f"sim-{i}", url=url)
"""


def test_two_live_markets_run_side_by_side_and_neither_touches_the_others_engines(tmp_path, seeded):
    """With other ports both run. The second's database remembers replicas at the first's
    engines' addresses (an earlier run on the default ports), and both share one engine admin
    token (a shared environment), so that a push to the wrong engines would be obeyed: each
    market's engines still carry that market's own policy and reserve, and each run pushed its
    control to its own engines, after they were up."""
    token = "shared-admin-token-for-both-markets-0123456789"
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    first = LiveMarket(a_dir, seeded[0], "--no-agents", **{ADMIN_TOKEN_ENV: token})
    second = None
    try:
        first.up()
        b_seed = b_dir / "seed.sqlite3"
        shutil.copy(seeded[0], b_seed)
        urls = [f"http://127.0.0.1:{port}" for port in first.replica_ports]
        subprocess.run(
            [*MANAGE, "shell", "-c", SECOND_MARKET % (urls,)], env=_embedded_env(b_seed),
            check=True, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        second = LiveMarket(b_dir, b_seed, "--no-agents", **{ADMIN_TOKEN_ENV: token})
        second.up()
        assert {first.web, first.engine, *first.replica_ports}.isdisjoint(
            {second.web, second.engine, *second.replica_ports}
        )
        for market, expected in (
            (first, ("dfs-auction-kv-split", 0.001)),
            (second, ("fcfs", 0.0042)),
        ):
            for i, port in enumerate(market.replica_ports, start=1):
                info = json.loads(_get(f"http://127.0.0.1:{port}/get_model_info"))
                assert (info["policy"], info["reserve"]) == expected, (market.base, port)
                # Its own run pushed to it, once it answered (not "unavailable" before).
                market.wait_line(rf"engine-{i}: market control pushed \(http://127.0.0.1:{port}\)")
            assert "not pushed" not in market.output
        assert "exited" not in first.output + second.output
        # The first market's engines took one control request each: their own run's.
        for i in (1, 2):
            log = (a_dir / "var" / "logs" / f"engine-{i}.log").read_text()
            assert log.count("market demo-llm: policy") == 1, log[-2000:]
    finally:
        if second is not None:
            second.stop()
        first.stop()


def test_embedded_the_automatic_reserve_steps_in_process(tmp_path, seeded):
    """Without Redis, live_market's pacing thread runs the automatic reserve's step: with a
    target no wait can meet (1 microsecond), each interval that served a request bidding above
    the reserve raises it by the full eighth: 0.001 -> 0.001125 -> 0.001265625 -> ..., each move
    a ReserveChange marked automatic, by nobody."""
    db, key = seeded
    auto = tmp_path / "auto.sqlite3"
    shutil.copy(db, auto)
    conn = sqlite3.connect(auto)
    with conn:
        conn.execute("UPDATE market_market SET auto_reserve = 1, auto_reserve_target_s = 1e-6")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # into the file LiveMarket copies
    conn.close()
    market = LiveMarket(tmp_path, auto, "--no-agents", "--replicas", "1",
                        AUTO_RESERVE_INTERVAL_S="0.5")  # fmt: skip
    try:
        market.up()
        deadline = time.monotonic() + 30
        rows: list[tuple] = []
        while time.monotonic() < deadline and len(rows) < 3:
            assert _chat(market.base, key, len(rows), bid=0.05)[0] == 200
            with sqlite3.connect(market.var.parent / "live.sqlite3") as conn:
                rows = conn.execute(
                    "SELECT old, new, automatic, changed_by_id FROM market_reservechange "
                    "ORDER BY at, id"
                ).fetchall()
    finally:
        market.stop()
    assert len(rows) >= 3, market.output
    expected = Decimal("0.001")
    for old, new, automatic, who in rows:
        assert (Decimal(str(old)), automatic, who) == (expected, 1, None)
        expected = (expected * Decimal("1.125")).quantize(Decimal("1e-9"))
        assert Decimal(str(new)) == expected
