"""The market over several hosts, rehearsed on one machine: each host a Linux network namespace.

    sudo .venv/bin/python -m tests.deploy.rehearsal [--requests 100] [--json PATH]

Needs root (``ip netns``). The hosts, on 10.231.0.0/24 behind a bridge in a namespace of its own
(nothing touches the machine's network), share only the service URLs and secrets they are given:
``db`` (.10: PostgreSQL and Redis, from ``config.local_services``), ``engines`` (.20: two
simulated replicas behind smg), ``worker`` (.30: Celery worker and beat; migrate, the demo's
seed, the market's setup and ``manage.py ledger_check`` run here), ``gateway-1`` and
``gateway-2`` (.41, .42: uvicorn) and ``client`` (.50: this process, which sends ``--requests``
chat requests with bids through each gateway, waits for settlement and counts the run's rows).

It exits 0 when every request was answered 200 and settled and ``ledger_check`` passed. Its
processes, namespaces (``rh<pid>-...``) and temporary folder go on success, failure, Ctrl-C or
SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from config.local_services import Running, postgres_start, redis_start
from config.serving import server_argv
from engines.router import RouterOptions, http_wait, router_argv, router_env, router_wait

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
NETWORK = "10.231.0.0/24"
HOSTS = {host: f"10.231.0.{n}" for host, n in (("db", 10), ("engines", 20), ("worker", 30),
         ("gateway-1", 41), ("gateway-2", 42), ("client", 50))}  # fmt: skip
GATEWAYS = ("gateway-1", "gateway-2")
ROUTER_PORT, GATEWAY_PORT = 30000, 8000  # smg's, then the two replicas' on the next ports
CONCURRENCY = 4  # requests in flight per gateway
BIDS = ("0.002", "0.01", "0.05")  # dollars per second of waiting, in turn
SETTLE_TIMEOUT_S = 60.0
BY_STATUS = "SELECT status, count(*) FROM accounts_request WHERE api_key_id = %s GROUP BY 1"
BY_KIND = "SELECT kind, count(*) FROM accounts_ledgerentry WHERE api_key_id = %s GROUP BY 1"
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def inside(namespace: str) -> Iterator[None]:
    """This thread in ``namespace`` for the block: its sockets and processes are that host's."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if _libc.setns(target, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), "setns")
        yield
    finally:
        _libc.setns(home, 0x40000000)
        os.close(target)
        os.close(home)


class Rehearsal:
    """The namespaces, services and processes of one run, for :meth:`close`."""

    def __init__(self) -> None:
        self.tag = f"rh{os.getpid()}"
        self.folder = Path(tempfile.mkdtemp(prefix="rehearsal-"))
        self.started = time.monotonic()
        self.namespaces: list[str] = []
        self.services: list[Running] = []
        self.processes: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:5.1f} s] {text}", flush=True)

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def network_up(self) -> None:
        switch = self.ns("switch")
        for namespace in (switch, *map(self.ns, HOSTS)):
            _ip("netns", "add", namespace)
            self.namespaces.append(namespace)
            _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for i, host in enumerate(HOSTS):
            port, nic = f"{self.tag}s{i}", f"{self.tag}h{i}"  # at most 15 characters
            _ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", nic,
                "netns", self.ns(host))  # fmt: skip
            _ip("-n", switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", self.ns(host), "addr", "add", f"{HOSTS[host]}/24", "dev", nic)
            _ip("-n", self.ns(host), "link", "set", nic, "up")
        self.say(f"network {NETWORK}: " + ", ".join(f"{h} {HOSTS[h]}" for h in HOSTS))

    def spawn(self, host: str, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = self.folder / f"{host}-{name}.log"
        with inside(self.ns(host)), log.open("ab") as out:
            process = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self.processes.append((f"{name} on {host}", process, log))
        return process

    def manage(self, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        """``manage.py args`` on the worker host."""
        with inside(self.ns("worker")):
            return subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=env,
                                  capture_output=True, text=True)  # fmt: skip

    def close(self) -> None:
        """SIGTERM to every process (SIGKILL to its session after 10 s), then the services,
        the namespaces (their links with them) and the folder."""
        for _, process, _ in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        for _, process, _ in reversed(self.processes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for service in reversed(self.services):
            service.stop()
        for namespace in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", namespace], check=False)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.say(f"cleaned up: processes stopped, namespaces {self.tag}-* and {self.folder} gone")


def market_prepare(engine_url: str, engines: dict[str, dict]) -> None:
    """On the worker host (``manage.py shell``): migrate, seed the demo, point its market at
    ``engine_url`` with ``engines`` as its replicas, as ``manage.py live_market`` does, and
    print (JSON) a fresh API key of the first demo tenant and the engines' command lines."""
    import io

    from django.core.management import call_command

    from accounts.models import Tenant
    from accounts.services import DEMO_TENANTS, api_key_create
    from config.management.commands.live_market import Command
    from market.engine_control import control_publish

    call_command("migrate", verbosity=0)
    call_command("seed_demo", stdout=io.StringIO())
    live = Command()
    market = live._market(engine_url, engines)
    control_publish(market)  # what the replicas read as they start, and follow
    key, secret = api_key_create(
        tenant=Tenant.objects.get(slug=DEMO_TENANTS[0][1]), name="rehearsal", created_by=None
    )
    argvs = {name: live._engine_argv(market, engine) for name, engine in engines.items()}
    print(json.dumps({"key": secret, "key_id": key.pk, "model": market.served_model,
                      "engines": argvs}))  # fmt: skip


def start(r: Rehearsal, base_env: dict[str, str]) -> tuple[dict, dict[str, str], dict[str, str]]:
    """Every host's services and processes, answering; the market's setup, the worker host's
    environment and the gateways' URLs."""
    with inside(r.ns("db")):
        r.services.append(postgres_start(r.folder / "postgres", HOSTS["db"], allow=NETWORK))
        r.services.append(redis_start(r.folder / "redis", HOSTS["db"]))
    database_url, redis_url = (s.url for s in r.services)
    r.say(f"db host: DATABASE_URL={database_url} REDIS_URL={redis_url}")
    keys = {name: secrets.token_urlsafe(32) for name in ("secret", "admin", "control")}
    django_env = {**base_env, "DATABASE_URL": database_url, "REDIS_URL": redis_url,
                  "SECRET_KEY": keys["secret"], "DEBUG": "0",
                  "ENGINE_ADMIN_TOKEN": keys["admin"]}  # fmt: skip
    engines = {f"sim-{i}": {"engine_id": f"sim-{i}", "port": ROUTER_PORT + i,
                            "url": f"http://{HOSTS['engines']}:{ROUTER_PORT + i}"}
               for i in (1, 2)}  # fmt: skip
    router = RouterOptions(port=ROUTER_PORT, host=HOSTS["engines"], control_key=keys["control"],
                           worker_urls=tuple(e["url"] for e in engines.values()))  # fmt: skip
    code = f"from tests.deploy.rehearsal import market_prepare as m; m({router.url!r}, {engines!r})"
    done = r.manage(django_env, "shell", "-c", code)
    if done.returncode != 0:
        raise RuntimeError(f"the market's setup: {done.stdout}{done.stderr}")
    setup = json.loads(done.stdout.splitlines()[-1])
    r.say(f"worker host: migrated, demo seeded, market -> {router.url} (smg) with replicas "
          f"{', '.join(router.worker_urls)}")  # fmt: skip
    replicas = []
    for name, argv in setup["engines"].items():  # live_market's command lines, on this host
        argv[argv.index("--host") + 1] = HOSTS["engines"]
        env = {**base_env, "ENGINE_ADMIN_TOKEN": keys["admin"]}
        replicas.append(r.spawn("engines", name, argv, env))
    celery = [PY, "-m", "celery", "-A", "config"]
    r.spawn("worker", "celery-worker", [*celery, "worker", "--loglevel=WARNING",
            "--concurrency=2"], django_env)  # fmt: skip
    r.spawn("worker", "celery-beat", [*celery, "beat", "--loglevel=WARNING", "--schedule",
            str(r.folder / "celerybeat-schedule")], django_env)  # fmt: skip
    gateways = {name: f"http://{HOSTS[name]}:{GATEWAY_PORT}" for name in GATEWAYS}
    servers = {}
    for name in GATEWAYS:
        argv = server_argv("uvicorn", host=HOSTS[name], port=GATEWAY_PORT, workers=2)
        env = {**django_env, "ALLOWED_HOSTS": HOSTS[name]}
        servers[name] = r.spawn(name, "uvicorn", argv, env)
    for process, url in zip(replicas, router.worker_urls, strict=True):
        http_wait(f"{url}/health", process)
    smg = r.spawn("engines", "smg", router_argv(router), router_env(base_env, router))
    router_wait(router.url, len(engines), smg, control_key=router.control_key)
    r.say(f"engines host: smg at {router.url}, {len(engines)} replicas healthy in it")
    for name, url in gateways.items():
        http_wait(f"{url}/healthz", servers[name])
    r.say(f"gateway hosts: {', '.join(gateways.values())} answer; worker host: Celery running")
    return setup, django_env, gateways


async def load(r: Rehearsal, gateways: dict[str, str], setup: dict, n: int) -> dict[str, dict]:
    """``n`` chat requests with bids through each gateway; its answers by status."""
    import openai

    answers = {name: Counter[str]() for name in gateways}

    async def send(name: str, client: openai.AsyncOpenAI, todo: Iterator[int]) -> None:
        for i in todo:
            try:
                await client.chat.completions.create(
                    model=setup["model"], max_tokens=16, extra_body={"bid": BIDS[i % len(BIDS)]},
                    messages=[{"role": "user", "content": f"{name}, question {i}: what next?"}],
                )  # fmt: skip
                answers[name]["200"] += 1
            except openai.APIStatusError as exc:
                answers[name][str(exc.status_code)] += 1
            except openai.APIError as exc:
                answers[name][type(exc).__name__] += 1

    async def gateway(name: str, base: str) -> None:
        async with openai.AsyncOpenAI(api_key=setup["key"], base_url=f"{base}/v1",
                                      max_retries=0, timeout=120) as client:  # fmt: skip
            todo = iter(range(n))
            await asyncio.gather(*(send(name, client, todo) for _ in range(CONCURRENCY)))

    async def progress() -> None:
        while True:
            await asyncio.sleep(2)
            r.say("load: " + ", ".join(f"{k} {v.total()}/{n}" for k, v in answers.items()))

    reporter = asyncio.create_task(progress())
    await asyncio.gather(*(gateway(name, base) for name, base in gateways.items()))
    reporter.cancel()
    return {name: dict(counts) for name, counts in answers.items()}


def rehearse(r: Rehearsal, n: int) -> dict:
    """The run; its figures."""
    import psycopg

    r.network_up()
    base_env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    base_env["PYTHONUNBUFFERED"] = "1"
    with inside(r.ns("client")):
        setup, django_env, gateways = start(r, base_env)
        r.say(f"load: {n} requests through each gateway, {CONCURRENCY} at a time each")
        answers = asyncio.run(load(r, gateways, setup, n))
        r.say(f"load: done, answers {answers}")
        with psycopg.connect(django_env["DATABASE_URL"], autocommit=True) as db:

            def count(query: str) -> dict[str, int]:
                return dict(db.execute(query, (setup["key_id"],)).fetchall())

            deadline = time.monotonic() + SETTLE_TIMEOUT_S
            while time.monotonic() < deadline:  # settled: none queued, every served charged
                requests, entries = count(BY_STATUS), count(BY_KIND)
                served = requests.get("served", 0)
                if "queued" not in requests and entries == {"priority": served, "tokens": served}:
                    break
                time.sleep(0.5)
            r.say(f"settlement: requests {requests}, ledger entries {entries}")
    check = r.manage(django_env, "ledger_check", "--grace", str(SETTLE_TIMEOUT_S))
    lines = (check.stdout + check.stderr).strip().splitlines()
    r.say(f"worker host: manage.py ledger_check: {' '.join(lines[-1:])}")
    ok = (
        check.returncode == 0
        and all(a == {"200": n} for a in answers.values())
        and requests == {"served": 2 * n}
        and entries == {"priority": 2 * n, "tokens": 2 * n}
    )
    return {
        "requests_per_gateway": n,
        "answers": answers,
        "requests_in_database": requests,
        "ledger_entries": entries,
        "ledger_check": {"ok": check.returncode == 0, "lines": lines},
        "seconds": round(time.monotonic() - r.started, 1),
        "ok": ok,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.deploy.rehearsal",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--requests", type=int, default=100, help="per gateway (100)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the figures there")
    opts = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("the rehearsal makes network namespaces (ip netns): run it as root")
    for variable in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        os.environ.pop(variable, None)  # the client talks to the rehearsal's addresses only

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupted)
    r = Rehearsal()
    figures = None
    try:
        figures = rehearse(r, opts.requests)
    except KeyboardInterrupt:
        r.say("interrupted: stopping")
    except Exception as exc:
        r.say(f"FAILED: {exc}")
        for name, process, log in r.processes:
            if process.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                r.say(f"{name} had exited ({process.returncode}):\n{tail}")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # the cleanup runs to its end
        r.close()
    if figures is None:
        return 1
    print(f"\nThe rehearsal over network namespaces ({figures['seconds']} s):")
    for name, answers in figures["answers"].items():
        print(f"  {name} ({HOSTS[name]}): {opts.requests} requests, answers {answers}")
    print(f"  requests of the run in the database: {figures['requests_in_database']}")
    print(f"  ledger entries of the run: {figures['ledger_entries']}")
    print(f"  manage.py ledger_check: {'; '.join(figures['ledger_check']['lines'])}")
    print(f"  verdict: {'ok' if figures['ok'] else 'FAILED'}", flush=True)
    if opts.json:
        opts.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
