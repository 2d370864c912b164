"""The README's main command's last step: ``manage.py live_market`` runs the whole market under
supervisord.

Each test runs it in a subprocess with a PostgreSQL database of its own, made from one migrated
and seeded once per module (with a tenant ``load`` of our own: its API key, a large budget and
an autobidder), and a Redis database of its own, emptied (its Celery worker must not take other
tests' tasks, nor they its; the control store and the rounds stream are per database too).
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from config.management.commands.live_market import (
    DEMO_PREFIX_HASH_ABS_THRESHOLD,
    DEMO_PREFIX_HASH_LOAD_FACTOR,
    port_free,
)
from engines.contract.control import RedisControlStore, now_state
from engines.contract.records import DEFAULT_STREAM
from engines.contract.wire import ADMIN_TOKEN_ENV
from engines.router import CONTROL_KEY_ENV, DEFAULT_POLICY, router_ready
from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
from tests.conftest import REPO_ROOT, dead_port

MANAGE = [sys.executable, str(REPO_ROOT / "manage.py")]
MODEL = "demo/tiny-llm"  # the demo market's (market.services.DEMO_MARKET)
REDIS_DBS = (14, 13)  # the live markets' own Redis databases (two run side by side)
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


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports free now, below the kernel's ephemeral range (where
    the connections the tests open take their ports)."""
    while True:
        first = random.randrange(20000, 32000 - n)
        if all(port_free("127.0.0.1", port) for port in range(first, first + n)):
            return first


def _server() -> dict[str, str]:
    """The tests' PostgreSQL server: how to reach it, without a database name."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    return {k: str(db[k.upper()] or "") for k in ("user", "password", "host", "port")}


def _database_url(name: str) -> str:
    server = _server()
    password = f":{urllib.parse.quote(server['password'], safe='')}" if server["password"] else ""
    auth = f"{urllib.parse.quote(server['user'], safe='')}{password}@"
    return f"postgres://{auth}{server['host'] or '127.0.0.1'}:{server['port'] or 5432}/{name}"


def _sql(statement: str, *, database: str = "postgres") -> list[tuple]:
    server = _server()
    with psycopg.connect(
        dbname=database, autocommit=True, **{k: v for k, v in server.items() if v}
    ) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


def _redis_url(db: int) -> str:
    """The tests' Redis server, database ``db``, emptied."""
    from django.conf import settings

    url = urllib.parse.urlsplit(settings.REDIS_URL)
    own = urllib.parse.urlunsplit(url._replace(path=f"/{db}"))
    redis.Redis.from_url(own).flushdb()
    return own


def _env(database: str, redis_db: int = REDIS_DBS[0], **extra: str) -> dict[str, str]:
    """The run's services, and no engine admin token: ``live_market`` makes its own, as
    ``make run`` on a fresh machine does."""
    env = {k: v for k, v in os.environ.items() if k != ADMIN_TOKEN_ENV}
    return {
        **env, "DATABASE_URL": _database_url(database), "REDIS_URL": _redis_url(redis_db), **extra
    }  # fmt: skip


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _wait(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.fixture(scope="module")
def seeded() -> Iterator[tuple[str, str]]:
    """A migrated, seeded database (a template: not to be written) and the ``load`` key."""
    name = f"live_seed_{uuid.uuid4().hex[:8]}"
    _sql(f"CREATE DATABASE {name}")
    env = _env(name)
    try:
        for step in (["migrate", "--noinput"], ["seed_demo"], ["shell", "-c", LOAD_TENANT]):
            done = subprocess.run(
                [*MANAGE, *step], env=env, check=True, capture_output=True, text=True, timeout=180
            )
        (key,) = re.findall(r"^KEY (\S+)$", done.stdout, flags=re.MULTILINE)
        yield name, key
    finally:
        _sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def database(seeded) -> Iterator[str]:
    """A database of this test's own: a copy of the seeded one."""
    name = f"live_{uuid.uuid4().hex[:8]}"
    _sql(f"CREATE DATABASE {name} TEMPLATE {seeded[0]}")
    yield name
    _sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


class LiveMarket:
    """``manage.py live_market`` in a subprocess; its output (supervisord's log among it) read
    by a thread, line by line."""

    def __init__(
        self, tmp_path: Path, database: str, *args: str, redis_db: int = REDIS_DBS[0], **env: str
    ) -> None:
        # With replicas (the default: two behind the gateway), they listen on the next ports,
        # then smg's Prometheus exporter.
        replicas = int(args[args.index("--replicas") + 1]) if "--replicas" in args else 2
        self.web, self.engine = _free_ports(1), _free_ports(replicas + 2 if replicas > 1 else 1)
        self.replica_ports = (
            [self.engine + i for i in range(1, replicas + 1)] if replicas > 1 else []
        )
        self.base = f"http://127.0.0.1:{self.web}"
        self.var = tmp_path / "var"
        self.database = database
        self.env = _env(database, redis_db, **env)
        self.redis_url = self.env["REDIS_URL"]
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            [*MANAGE, "live_market", "--port", str(self.web), "--engine-port", str(self.engine),
             "--var", str(self.var), *args],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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
        """The pid supervisord started ``name`` with (the first start from line ``after``)."""
        return int(self.wait_line(rf"spawned: '{name}' with pid (\d+)", after=after)[1])

    def up(self) -> LiveMarket:
        self.wait_line("Ctrl-C stops everything")
        return self

    def processes(self) -> list[psutil.Process]:
        """live_market's processes: supervisord and all it started, theirs included."""
        return psutil.Process(self.proc.pid).children(recursive=True)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM (or SIGINT, as Ctrl-C): every process it started must be gone and every
        port closed."""
        started = self.processes() if self.proc.poll() is None else []
        self.proc.send_signal(sig)
        self.proc.wait(timeout=60)
        left = [p for p in started if _running(p.pid)]
        assert not left, f"left running: {[' '.join(p.cmdline()) for p in left]}"
        ports = [self.web, self.engine, *self.replica_ports]
        assert not any(_listening(p) for p in ports), "a port is still open"
        assert "CommandError" not in self.output, self.output


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


def _call(method: str, url: str, body: dict | None = None, token: str | None = None) -> int:
    """The status of one request (a JSON body, a bearer token when given)."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code


def _workers(market: LiveMarket, token: str) -> list[dict]:
    """smg's workers, as its control plane lists them to the run's token."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{market.engine}/workers", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        return json.loads(reply.read())["workers"]


def _settled(market: LiveMarket) -> tuple[set[str], int]:
    """The engines that wrote round records to the market's stream, and how many entries the
    Celery worker has not taken yet (the consumer group's lag)."""
    client = redis.Redis.from_url(market.redis_url, decode_responses=True)
    try:
        engines = {json.loads(e["record"])["engine"] for _, e in client.xrange(DEFAULT_STREAM)}
        groups = client.xinfo_groups(DEFAULT_STREAM) if engines else []
    finally:
        client.close()
    lag = sum(g.get("lag") or 0 for g in groups) + sum(g["pending"] for g in groups)
    return engines, (lag if groups else -1)


def test_live_market_serves_bidding_agents_and_stops_cleanly(tmp_path, database):
    market = LiveMarket(tmp_path, database, "--sessions-per-minute", "240")
    try:
        market.up()
        banner = market.output
        assert f"{market.base}/console/" in banner and "operator-demo-pass" in banner
        assert "SGLang's model gateway (smg) in front of 2 simulated replicas" in banner
        assert json.loads(_get(f"{market.base}/healthz"))["status"] == "ok"
        # The entry point is the gateway, with both replicas healthy behind it (its control
        # plane: the run's token).
        token = _environ(market.pid_of("engine-1"))[ADMIN_TOKEN_ENV]
        workers = _workers(market, token)
        assert sorted(w["url"] for w in workers if w["is_healthy"]) == [
            f"http://127.0.0.1:{p}" for p in market.replica_ports
        ]
        for port in market.replica_ports:
            assert _get(f"http://127.0.0.1:{port}/health") == b""
        # smg's Prometheus exporter is on the port after the replicas'.
        assert b"# TYPE" in _get(f"http://127.0.0.1:{market.engine + 3}/metrics")
        # The agents' requests go through the gateway and smg; both replicas' round records
        # reach the Redis stream, and the Celery worker takes them.
        _wait(lambda: _settled(market)[0] >= {"sim-1", "sim-2"}, "a replica ran no round")
        # Secrets are in the programs' environment, never on a command line (``ps``).
        config = market.var / "supervisord.conf"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        agents = psutil.Process(market.pid_of("agents"))
        keys = _environ(agents.pid)["AGENT_KEYS"].split()
        assert sorted(k.partition("=")[0] for k in keys) == ["acme", "globex"]
        for process in market.processes():
            command = " ".join(process.cmdline())
            assert token not in command and not any(k.partition("=")[2] in command for k in keys)
    finally:
        market.stop()
    assert "exited:" not in market.output  # nothing crashed meanwhile


def test_ctrl_c_stops_everything(tmp_path, database):
    market = LiveMarket(tmp_path, database, "--no-agents", "--replicas", "1")
    market.up()
    assert len(market.processes()) >= 6  # supervisord, engine, web (and its workers), celery
    market.stop(signal.SIGINT)


def test_a_killed_replica_is_routed_around_and_restarted(tmp_path, database, seeded):
    key = seeded[1]
    market = LiveMarket(tmp_path, database, "--no-agents")
    try:
        market.up()
        victim = market.pid_of("engine-1")
        assert _chat(market.base, key, 0, bid=0.01)[0] == 200
        seen = len(market.lines)
        os.kill(victim, signal.SIGKILL)
        # smg sends the market's requests to the replica left: the tenant sees no error.
        statuses = [_chat(market.base, key, i, bid=0.01)[0] for i in range(1, 7)]
        assert statuses == [200] * 6, statuses
        market.wait_line(r"exited: engine-1 \(terminated by SIGKILL; not expected\)", after=seen)
        assert market.pid_of("engine-1", after=seen) != victim
        _wait(lambda: _listening(market.replica_ports[0]), "the replica was not started again")
        assert _get(f"http://127.0.0.1:{market.replica_ports[0]}/health") == b""
    finally:
        market.stop()


def test_a_killed_engine_comes_back_with_the_markets_current_control(tmp_path, database, seeded):
    """While the engine is down the gateway answers 503 ``engine_unavailable``; the engine
    restarted reads the market's policy and reserve from the control store (a change made while
    it was down included), with no push from anyone."""
    key = seeded[1]
    market = LiveMarket(tmp_path, database, "--no-agents", "--replicas", "1")
    try:
        market.up()
        engine_pid, web_pid = market.pid_of("engine"), market.pid_of("web")
        assert _chat(market.base, key, 0, bid=0.01)[0] == 200
        seen = len(market.lines)
        os.kill(engine_pid, signal.SIGKILL)
        while _listening(market.engine):  # the kernel closes its port as it dies
            time.sleep(0.02)
        # The operator's change while it is down reaches the store only.
        store = RedisControlStore(market.redis_url, "demo-llm")
        store.write(now_state("fcfs", 0.0025))
        store.close()
        status, body = _chat(market.base, key, 1, bid=0.01)
        assert status == 503, body  # not a refused connection: the gateway is still there
        assert body["error"]["code"] == "engine_unavailable"
        market.wait_line(r"exited: engine \(terminated by SIGKILL; not expected\)", after=seen)
        assert market.pid_of("engine", after=seen) != engine_pid
        _wait(lambda: _listening(market.engine), "the engine was not started again")
        status, body = _chat(market.base, key, 2, bid=0.01)
        assert status == 200, body  # a round ran: the engine's values are the store's
        info = json.loads(_get(f"http://127.0.0.1:{market.engine}/get_model_info"))
        assert (info["policy"], info["reserve"]) == ("fcfs", 0.0025)
        assert json.loads(_get(f"{market.base}/healthz"))["status"] == "ok"
        # The web server served throughout: it was never restarted.
        assert market.pid_of("web") == web_pid and "exited: web" not in market.output
        assert len(re.findall(r"spawned: 'web'", market.output)) == 1
    finally:
        market.stop()


def test_concurrent_requests_are_answered_while_settling_without_5xx(tmp_path, database, seeded):
    """The gateway's database threads, the Celery worker taking round records and the pacing
    steps (every 0.1 s here) at once: every request must still be served."""
    key = seeded[1]
    market = LiveMarket(
        tmp_path, database, "--no-agents", "--replicas", "1", AUTOBID_INTERVAL_S="0.1"
    )
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
        # The worker took the engine's round records meanwhile (they move no money), all of
        # them.
        _wait(lambda: _settled(market)[1] == 0, "round records left untaken", timeout_s=30)
    finally:
        market.stop()
    logs = (market.var / "logs" / "web.log").read_text()
    assert "unexpected error" not in logs and "Traceback" not in logs


def test_a_killed_web_server_leaves_no_workers_behind(tmp_path, database, seeded):
    """uvicorn's main process SIGKILLed (two workers): its workers, orphaned, held the port, so
    the restarted server exited 3 ("address already in use") for ever. What the server left is
    stopped before it starts again (``config.launch``), and on stopping."""
    key = seeded[1]
    market = LiveMarket(tmp_path, database, "--no-agents", "--replicas", "1")
    try:
        market.up()
        web = market.pid_of("web")
        left = [p.pid for p in psutil.Process(web).children(recursive=True)]
        assert len(left) >= 2, "uvicorn runs two workers"
        seen = len(market.lines)
        os.kill(web, signal.SIGKILL)
        market.wait_line(r"exited: web \(terminated by SIGKILL; not expected\)", after=seen)
        again = market.pid_of("web", after=seen)
        assert again != web
        _wait(lambda: not [pid for pid in left if _running(pid)], "the old workers outlived it")

        def healthy() -> bool:
            try:
                return json.loads(_get(f"{market.base}/healthz"))["status"] == "ok"
            except OSError:
                return False

        _wait(healthy, "the restarted web server does not answer")
        assert _chat(market.base, key, 0, bid=0.01)[0] == 200
        # The restarted server is the one serving, and it stays up.
        time.sleep(3)
        assert _running(again), market.output
        assert len(re.findall(r"exited: web", market.output)) == 1, market.output
        children = [p.pid for p in psutil.Process(again).children(recursive=True)]
        assert len(children) >= 2
    finally:
        market.stop()
    assert not [pid for pid in children if _running(pid)], "workers left after the stop"


def test_the_engines_control_is_closed_to_whoever_lacks_the_runs_token(tmp_path, database, seeded):
    """With no ENGINE_ADMIN_TOKEN set, ``live_market`` makes one for its run: the engine asks
    for it, the web server (which pushes the console's changes) holds it, and a POST to the
    engine's control path without it changes nothing."""
    key = seeded[1]
    market = LiveMarket(tmp_path, database, "--no-agents", "--replicas", "1")
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


def test_the_routers_control_plane_is_closed_to_whoever_lacks_the_runs_token(
    tmp_path, database, seeded
):
    """Issue 45's reproduction: a rogue engine on this host, registered with smg by whoever
    reaches its port, served the market's requests; the real replicas could be removed and the
    caches flushed the same way. smg's control plane takes the run's token (the engine admin
    token, in smg's environment, not on its command line): without it ``POST /workers``,
    ``DELETE /workers/{id}`` and ``POST /flush_cache`` answer 401 and change nothing, the
    rogue serves none of the requests after, and the market's own health path (``GET
    /workers`` with the token, what ``live_market`` waits on) still answers."""
    key = seeded[1]
    market = LiveMarket(tmp_path, database, "--no-agents")
    rogue = ServerThread(
        ServerOptions.of(port=0, engine_id="rogue", policy="fcfs", reserve=0.0, market="demo-llm")
    ).start()
    served: list[str] = []
    rogue.call(lambda: rogue.server.callbacks.callbacks.append(
        lambda record: served.extend(a["request_id"] for a in record["admitted"])
    ))  # fmt: skip
    try:
        market.up()
        token = _environ(market.pid_of("engine-1"))[ADMIN_TOKEN_ENV]
        # smg's key is the token, in its program's environment, not on its command line (smg
        # rewrites its /proc environ as it sets its process title, so the file is what to read).
        (section,) = re.findall(
            r"^\[program:router\]\n(.*?)(?=^\[|\Z)",
            (market.var / "supervisord.conf").read_text(),
            flags=re.MULTILINE | re.DOTALL,
        )
        (command,) = re.findall(r"^command=(.*)$", section, flags=re.MULTILINE)
        assert f'{CONTROL_KEY_ENV}="{token}"' in section and token not in command
        assert token not in " ".join(psutil.Process(market.pid_of("router")).cmdline())
        front = f"http://127.0.0.1:{market.engine}"
        replicas = sorted(f"http://127.0.0.1:{p}" for p in market.replica_ports)
        ids = [w["id"] for w in _workers(market, token)]
        for auth in (None, "guess"):
            assert _call("POST", f"{front}/workers", {"url": rogue.url}, auth) == 401
            for worker in ids:
                assert _call("DELETE", f"{front}/workers/{worker}", token=auth) == 401
            assert _call("POST", f"{front}/flush_cache", token=auth) == 401
            assert _call("GET", f"{front}/workers", token=auth) == 401
        time.sleep(3)  # what smg would have queued (a registration, a removal) has run
        workers = _workers(market, token)
        assert sorted(w["url"] for w in workers if w["is_healthy"]) == replicas
        assert sorted(w["id"] for w in workers) == sorted(ids)
        assert router_ready(front, 2, control_key=token) and not router_ready(front, 2)
        answers = [_chat(market.base, key, i, bid=0.01) for i in range(12)]
        assert [status for status, _ in answers] == [200] * 12, answers[:2]
        assert served == []  # the rogue engine served nothing
        assert json.loads(_get(f"{market.base}/healthz"))["status"] == "ok"
    finally:
        rogue.stop()
        market.stop()


def test_write_config_writes_a_reusable_file_and_starts_nothing(tmp_path, database):
    path = tmp_path / "deploy" / "market.conf"
    # The entry point, its two replicas on the ports after it and smg's exporter after theirs,
    # all free and below the ephemeral range (a port there can be a test's connection's).
    engine = _free_ports(4)
    done = subprocess.run(
        [*MANAGE, "live_market", "--var", str(tmp_path / "var"), "--engine-port", str(engine),
         "--port", str(_free_ports(1)), "--write-config", str(path)],
        env=_env(database), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"supervisord -n -c {path}" in done.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    programs = re.findall(r"^\[program:(\S+)\]$", text, flags=re.MULTILINE)
    assert programs == ["engine-1", "engine-2", "router", "web", "worker", "beat", "agents"]
    for option in ("autorestart=true", "stopasgroup=true", "killasgroup=true"):
        assert text.count(option) == len(programs), option
    priorities = [int(p) for p in re.findall(r"^priority=(\d+)$", text, flags=re.MULTILINE)]
    assert priorities == sorted(priorities) and len(set(priorities)) == len(programs)
    commands = "\n".join(re.findall(r"^command=(.*)$", text, flags=re.MULTILINE))
    assert "im_" not in commands and ADMIN_TOKEN_ENV not in commands
    assert re.search(r'^environment=AGENT_KEYS="acme=im_\S+ globex=im_\S+"$', text, re.MULTILINE)
    assert "--follow-control" in commands and "--redis-url" in commands
    # The agents size their load to the engines' capacity, measured as they start: no fixed
    # rate that overloads a small machine.
    (agents,) = [c for c in commands.splitlines() if "benchmarks.agents" in c]
    assert "--load 0.85" in agents and "--sessions-per-minute" not in agents
    # The fleet's routing, with the demo's overload test (two replicas, one per prompt at best).
    (router,) = [c for c in commands.splitlines() if "engines.router" in c]
    assert f" --policy {DEFAULT_POLICY} " in router
    assert (
        f" --prefix-hash-load-factor {DEMO_PREFIX_HASH_LOAD_FACTOR}"
        f" --prefix-hash-balance-abs-threshold {DEMO_PREFIX_HASH_ABS_THRESHOLD} " in router
    )
    assert not (tmp_path / "var" / "logs" / "engine-1.log").exists()
    assert not _listening(engine + 1)


def _live_market_now(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``live_market`` run to its end (it must end at once: it is to start nothing, nor touch
    the database, which does not exist)."""
    return subprocess.run(
        [*MANAGE, "live_market", "--no-agents", "--var", str(tmp_path / "var-b"), *args],
        env=_env("live_no_such_database", REDIS_DBS[1]), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def test_a_second_live_market_on_taken_ports_stops_at_once_naming_the_port(tmp_path, database):
    """What ``make run`` twice on one machine did: the second printed "running", restarted its
    children for ever, and pushed its control to the first one's engines. Now it stops before
    starting anything, naming the busy port and the option (and ``make run`` variable) that
    moves it."""
    first = LiveMarket(tmp_path, database, "--no-agents")
    try:
        first.up()
        pids = {name: first.pid_of(name) for name in ("engine-1", "engine-2", "router", "web")}
        cases = [  # (web port, engine port): the port named, the option named
            ((first.web, dead_port()), first.web, "--port (make run PORT=...)"),
            ((dead_port(), first.engine), first.engine, "--engine-port (make run ENGINE_PORT=...)"),
            # Its replicas would take the first market's entry point and its first replica.
            ((dead_port(), first.engine - 1), first.engine, "--engine-port"),
            # Its smg's Prometheus exporter would take the first market's entry point.
            ((dead_port(), first.engine - 3), first.engine, "--engine-port"),
            # The first market's smg exporter listens on the port after its replicas'.
            ((first.engine + 3, dead_port()), first.engine + 3, "--port"),
        ]
        for (web, engine), busy, option in cases:
            began = time.monotonic()
            done = _live_market_now(tmp_path, "--port", str(web), "--engine-port", str(engine))
            took = time.monotonic() - began
            assert done.returncode == 1, done
            assert f"port {busy} (" in done.stderr and "is in use" in done.stderr, done.stderr
            assert option in done.stderr, done.stderr
            assert "spawned" not in done.stdout and "running" not in done.stdout, done.stdout
            assert took < 30, took  # a Django start and a few binds: no child was waited for
            # `make run` checks first: the same answer, before migrating or seeding.
            checked = _live_market_now(
                tmp_path, "--check-ports", "--port", str(web), "--engine-port", str(engine)
            )
            assert checked.returncode == 1 and f"port {busy} (" in checked.stderr
        # The first market never noticed: the same processes, no restart.
        assert {name: first.pid_of(name) for name in pids} == pids
        assert "exited:" not in first.output
        assert not (tmp_path / "var-b" / "logs").exists()
    finally:
        first.stop()
    free = _live_market_now(tmp_path, "--check-ports", "--port", str(dead_port()))
    assert free.returncode == 0 and free.stderr == "", free


SECOND_MARKET = """
from market.models import Market, Replica
market = Market.objects.get(slug="demo-llm")
Market.objects.filter(pk=market.pk).update(reserve="0.004200000", policy="fcfs")
# As an earlier run left them: the replicas' addresses are now the first market's engines.
for i, url in enumerate(%r, start=1):
    Replica.objects.create(market=market, engine_id=f"sim-{i}", url=url)
"""


def test_two_live_markets_run_side_by_side_and_neither_touches_the_others_engines(
    tmp_path, database, seeded
):
    """With other ports (and a database and Redis database of its own) both run. The second's
    database remembers replicas at the first's engines' addresses (an earlier run on the default
    ports), and both share one engine admin token (a shared environment), so that a push to the
    wrong engines would be obeyed: each market's engines carry that market's own policy and
    reserve, and no engine was sent a control request."""
    token = "shared-admin-token-for-both-markets-0123456789"
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    b_database = f"live_{uuid.uuid4().hex[:8]}"
    _sql(f"CREATE DATABASE {b_database} TEMPLATE {seeded[0]}")
    first = LiveMarket(a_dir, database, "--no-agents", **{ADMIN_TOKEN_ENV: token})
    second = None
    try:
        first.up()
        urls = [f"http://127.0.0.1:{port}" for port in first.replica_ports]
        subprocess.run(
            [*MANAGE, "shell", "-c", SECOND_MARKET % (urls,)], env=_env(b_database, REDIS_DBS[1]),
            check=True, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        second = LiveMarket(
            b_dir, b_database, "--no-agents", redis_db=REDIS_DBS[1], **{ADMIN_TOKEN_ENV: token}
        )
        second.up()
        assert {first.web, first.engine, *first.replica_ports}.isdisjoint(
            {second.web, second.engine, *second.replica_ports}
        )
        for market, expected in (
            (first, ("dfs-auction-kv-split", 0.001)),
            (second, ("fcfs", 0.0042)),
        ):
            for port in market.replica_ports:
                info = json.loads(_get(f"http://127.0.0.1:{port}/get_model_info"))
                assert (info["policy"], info["reserve"]) == expected, (market.base, port)
        assert "exited:" not in first.output + second.output
        # No engine took a control request: each reads its own market's store.
        for directory in (a_dir, b_dir):
            for i in (1, 2):
                log = (directory / "var" / "logs" / f"engine-{i}.log").read_text()
                assert "market demo-llm: policy" not in log, log[-2000:]
    finally:
        if second is not None:
            second.stop()
        first.stop()
        _sql(f"DROP DATABASE IF EXISTS {b_database} WITH (FORCE)")


def test_the_automatic_reserve_steps_on_beat(tmp_path, database, seeded):
    """Celery beat runs the automatic reserve's step: with a target no wait can meet (1
    microsecond), each interval that served a request bidding above the reserve raises it by the
    full eighth: 0.001 -> 0.001125 -> 0.001265625 -> ..., each move a ReserveChange marked
    automatic, by nobody."""
    key = seeded[1]
    _sql(
        "UPDATE market_market SET auto_reserve = true, auto_reserve_target_s = 1e-6",
        database=database,
    )
    market = LiveMarket(
        tmp_path, database, "--no-agents", "--replicas", "1", AUTO_RESERVE_INTERVAL_S="0.5"
    )
    try:
        market.up()
        deadline = time.monotonic() + 60
        rows: list[tuple] = []
        while time.monotonic() < deadline and len(rows) < 3:
            assert _chat(market.base, key, len(rows), bid=0.05)[0] == 200
            rows = _sql(
                "SELECT old, new, automatic, changed_by_id FROM market_reservechange "
                "ORDER BY at, id",
                database=database,
            )
    finally:
        market.stop()
    assert len(rows) >= 3, market.output
    expected = Decimal("0.001")
    for old, new, automatic, who in rows:
        assert (old, automatic, who) == (expected, True, None)
        # The full eighth, to the money's 9 places. The step is worked in floats, so an exact
        # half (0.001423828 x 1.125 = 0.0016018065, the fifth step) may round either way.
        assert abs(new - old * Decimal("1.125")) <= Decimal("0.5e-9"), (old, new)
        expected = new


def test_make_run_passes_run_args_to_both_live_market_calls() -> None:
    """``make run RUN_ARGS=...`` gives the options to the port check and to the run itself
    (``make -n``: printed, nothing run)."""
    done = subprocess.run(
        ["make", "-n", "run", "RUN_ARGS=--no-agents --load 0.5", "PORT=8123"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    calls = re.findall(r"manage\.py live_market ([^&'\\]*)", done.stdout)
    assert len(calls) == 2, done.stdout
    check, run = (c.split() for c in calls)
    assert check[-1] == "--check-ports" and "--check-ports" not in run
    for argv in (check, run):
        assert argv[argv.index("--port") + 1] == '"8123"'
        at = argv.index("--no-agents")
        assert argv[at + 1 : at + 3] == ["--load", "0.5"]
