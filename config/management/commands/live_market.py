"""``manage.py live_market``: the whole live market in one command (what ``make run`` runs).

Starts, as child processes, and stops them all on Ctrl-C:

- the market's engines: by default two simulated replicas in real time (``engines.sim.server``,
  each with the demo market's policy and reserve, following the control store when there is
  Redis) behind SGLang's model gateway, smg (``engines.router``, ``--router-policy``), on
  ``--engine-port``, the market's entry point; with ``--replicas 1``, one engine there and no
  gateway. The replicas are the market's (``market.Replica``), so the console's controls and
  status reach each;
- the web server: with Redis, ``--web-server`` (uvicorn by default, ``config.serving``) with
  ``--web-workers`` processes (2), a Celery worker and celery beat (round records through
  the Redis stream, pacing and the live publishers on beat); without Redis (the embedded
  defaults), ``manage.py live_serve``, which runs Daphne with the round-record follower and the
  live publishers in the same process, since the in-memory channel layer does not cross
  processes (the autobidders' pacing steps then run here, in a thread);
- a load of agents bidding through the gateway (``benchmarks.agents``) with fresh API
  keys of the demo tenants; Globex's requests without a bid go through its autobidder. The demo
  engines are small (``DEMO_ENGINE``: a few requests running at a time) and the load is near
  what they serve, so that the console shows what the market is for: queues, subtrees
  competing in the book, priority charges.

Before anything starts (and before the database is touched), every port the run will listen on
is checked (``--check-ports`` checks them and exits: ``make run`` does that first): one in use,
by another live market say, stops the command with a message naming the port and the option
(and ``make run`` variable) that moves it. Once its engines answer, and not before, the market's
policy and reserve are pushed to them, and only to them: never to the engines an earlier run (or
another live market sharing the database) left in the market's replicas.

Once all are up, a child that exits (the engine crashed, say) is started again with backoff
(``config.supervisor``), and the others keep serving meanwhile: the gateway
answers 503 ``engine_unavailable`` until the engine is back. A restarted engine gets the
market's policy and reserve as they are then. The engines' control path is closed to anyone
without the engine admin token (``ENGINE_ADMIN_TOKEN``; when it is not set, this command makes
one for its run). Logs go to ``var/logs/``; the command prints the
URLs, the demo logins, and every exit and start of a child.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, close_old_connections, transaction

from accounts.models import ApiKey, Autobidder, Tenant
from accounts.services import DEMO_OPERATOR, DEMO_TENANTS, api_key_create, api_key_revoke
from accounts.services.autobidder import autobidder_configure
from config.serving import MULTI_WORKER_SERVERS, SERVERS, server_argv
from config.supervisor import ChildSpec, Process, RestartPolicy, Supervisor
from engines.contract.wire import ADMIN_TOKEN_ENV
from engines.router import RouterOptions, http_wait, router_argv, router_env, router_wait
from market.engine_control import EngineUnreachable, engine_config_push
from market.models import Market, Replica
from market.services import market_demo_seed, replica_set

ROOT = Path(settings.BASE_DIR)
AGENT_KEY_NAME = "live-market agents"
# Embedded mode: celery beat's entries that this command runs, each at its beat interval (the
# round records and the live publishers run in live_serve).
EMBEDDED_JOBS = ("autobidders-step", "hold-horizons", "auto-reserves", "holds-sweep")
# The demo's engines: a small deployment (a few requests at a time, a slow decode), so that the
# agents' load queues requests and the auction has something to order.
DEMO_ENGINE = ("max_running_requests=4", "step_fixed_s=0.03")
DEMO_SESSIONS_PER_MINUTE = 60.0  # the agents' load: about what two such replicas serve


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now: bound and released at once, with
    SO_REUSEADDR as servers set it (a port whose connections linger in TIME_WAIT is free; one
    with a listener is not)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Run the live market: engine, web server, settlement, publishers and bidding agents."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--engine-port", type=int, default=30000,
            help="the market's entry point: the router, or the one engine (replicas on the "
            "next ports)",
        )  # fmt: skip
        parser.add_argument("--replicas", type=int, default=2, help="simulated replicas")
        parser.add_argument(
            "--router-policy", default="cache_aware",
            choices=["cache_aware", "round_robin", "random", "power_of_two"],
        )  # fmt: skip
        parser.add_argument("--sessions-per-minute", type=float, default=DEMO_SESSIONS_PER_MINUTE)
        parser.add_argument("--no-agents", action="store_true", help="no load generator")
        parser.add_argument(
            "--web-server", choices=SERVERS, default="uvicorn",
            help="the web server with Redis (config.serving); without Redis it is Daphne",
        )  # fmt: skip
        parser.add_argument(
            "--web-workers", type=int, default=2,
            help="the web server's processes with Redis (uvicorn, granian)",
        )  # fmt: skip
        parser.add_argument(
            "--var", type=Path, default=ROOT / "var", help="logs and round records (var/)"
        )
        parser.add_argument(
            "--restart-delay",
            type=float,
            default=RestartPolicy.initial_s,
            metavar="SECONDS",
            help="first delay before a child that exited is started again (then doubled, "
            f"at most {RestartPolicy.max_s:g} s)",
        )
        parser.add_argument(
            "--check-ports", action="store_true",
            help="only check that every port this run would listen on is free, then exit",
        )  # fmt: skip

    def handle(self, *args: Any, **opts: Any) -> None:
        var = opts["var"]
        logs = var / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        if opts["replicas"] < 1:
            raise CommandError("--replicas must be at least 1")
        if opts["web_workers"] < 1:
            raise CommandError("--web-workers must be at least 1")
        if opts["web_server"] not in MULTI_WORKER_SERVERS:
            opts["web_workers"] = 1
        self._ports_check(opts)
        if opts["check_ports"]:
            return
        self._metrics_dir = var / "prometheus"
        self._engine_admin_token()
        engine_url = f"http://127.0.0.1:{opts['engine_port']}"
        engines = self._engines(opts, var)
        market = self._market(engine_url, engines)
        keys = self._agent_keys()
        redis_url = settings.REDIS_URL
        base = f"http://{opts['host']}:{opts['port']}"
        children = self._children(opts, market, engines, keys, base)
        supervisor = Supervisor(
            launch=lambda spec: self._start(spec.name, spec.command(), logs),
            policy=RestartPolicy(initial_s=opts["restart_delay"]),
            report=self._report,
        )
        for spec in children:
            supervisor.add(spec)
        stop = threading.Event()
        # SIGTERM and SIGHUP stop the market as Ctrl-C does: children are never left behind.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _interrupt)
        try:
            # Started in order, each waited for: a child that fails here is a setup error (a
            # port taken, a bad option), which no restart would mend.
            for spec in children:
                self._started(supervisor, spec.name, engines, engine_url, base)
            self._control_push(market, engines)
            if not redis_url:
                threading.Thread(target=self._pace, args=(stop,), daemon=True).start()
            self._banner(base, market, redis_url, logs)
            supervisor.run()
        except KeyboardInterrupt:
            self.stdout.write("\nStopping the live market ...")
        finally:
            stop.set()
            # A second Ctrl-C must not cut the stopping short and leave children behind.
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            supervisor.stop_all()

    def _children(
        self,
        opts: dict[str, Any],
        market: Market,
        engines: dict[str, dict[str, Any]],
        keys: dict[str, str],
        base: str,
    ) -> list[ChildSpec]:
        """What this run starts, in order: the engines, smg in front of several, the web server
        (and with Redis the Celery worker and beat), the agents."""
        redis_url = settings.REDIS_URL
        var = opts["var"]
        py = sys.executable
        children = [
            ChildSpec(name, lambda e=e: self._engine_argv(market, e, redis_url))
            for name, e in engines.items()
        ]
        if len(engines) > 1:
            router = RouterOptions(
                port=opts["engine_port"],
                worker_urls=tuple(e["url"] for e in engines.values()),
                policy=opts["router_policy"],
            )  # the market's routing settings (engines.router), as the replicas benchmark chose
            children.append(ChildSpec("router", router_argv(router)))
        if redis_url:
            children += [
                ChildSpec("web", server_argv(opts["web_server"], host=opts["host"],
                                             port=opts["port"], workers=opts["web_workers"])),
                ChildSpec("worker", [py, "-m", "celery", "-A", "config", "worker",
                                     "--loglevel=WARNING", "--concurrency=2"]),
                ChildSpec("beat", [py, "-m", "celery", "-A", "config", "beat",
                                   "--loglevel=WARNING", "--schedule",
                                   str(var / "celerybeat-schedule")]),
            ]  # fmt: skip
        else:
            serve = [py, str(ROOT / "manage.py"), "live_serve", "--host", opts["host"],
                     "--port", str(opts["port"])]  # fmt: skip
            for e in engines.values():
                serve += ["--rounds-jsonl", str(e["rounds"])]
            children.append(ChildSpec("web", serve))
        if not opts["no_agents"]:
            agents = [py, "-m", "benchmarks.agents", "--base-url", f"{base}/v1",
                      "--model", market.served_model,
                      "--sessions-per-minute", str(opts["sessions_per_minute"])]  # fmt: skip
            for slug, key in keys.items():
                agents += ["--key", f"{slug}={key}"]
            children.append(ChildSpec("agents", agents))
        return children

    def _started(
        self,
        supervisor: Supervisor,
        name: str,
        engines: dict[str, dict[str, Any]],
        engine_url: str,
        base: str,
    ) -> None:
        """Start the child ``name`` and wait until it answers: an engine its health, smg its
        replicas, the web server its health check."""
        proc = supervisor.start(name)
        if name in engines:
            self._wait_http(f"{engines[name]['url']}/health", name, proc)
        elif name == "router":
            try:
                router_wait(engine_url, len(engines), proc, timeout_s=60.0)
            except RuntimeError as exc:
                raise CommandError(f"{exc}; see var/logs/router.log") from None
        elif name == "web":
            self._wait_http(f"{base}/healthz", name, proc)

    # --- setup --------------------------------------------------------------------------------

    def _ports(self, opts: dict[str, Any]) -> list[tuple[str, int, str, str]]:
        """Every port this run listens on: (host, port, what listens there, what moves it)."""
        web, entry = "--port (make run PORT=...)", "--engine-port (make run ENGINE_PORT=...)"
        n, first = opts["replicas"], opts["engine_port"]
        ports = [(opts["host"], opts["port"], "the web server", web)]
        if n == 1:
            return [*ports, ("127.0.0.1", first, "the engine", entry)]
        ports.append(("127.0.0.1", first, "the market's entry point, smg", entry))
        for i in range(1, n + 1):
            what = f"replica engine-{i}, on the ports after the entry point's"
            ports.append(("127.0.0.1", first + i, what, entry))
        return ports

    def _ports_check(self, opts: dict[str, Any]) -> None:
        """Stop (CommandError) unless every port of the run is valid, distinct and free."""
        seen: dict[int, str] = {}
        for host, port, what, moved_by in self._ports(opts):
            if not 0 < port < 65536:
                raise CommandError(f"port {port} ({what}) is not a TCP port; set {moved_by}")
            if port in seen:
                raise CommandError(
                    f"port {port} would serve both {seen[port]} and {what}; set {moved_by}"
                )
            seen[port] = what
            if not port_free(host, port):
                raise CommandError(
                    f"port {port} ({what}) is in use on {host}: another live market or another "
                    f"program listens there. Nothing was started; choose a free port with "
                    f"{moved_by}."
                )

    def _engine_admin_token(self) -> None:
        """The engines' control is closed without an admin token: without one configured, this
        run makes one of its own, which its children (the engines, the web server, the worker)
        inherit and the market's pushes send."""
        if settings.ENGINE_ADMIN_TOKEN:
            return
        token = secrets.token_urlsafe(32)
        settings.ENGINE_ADMIN_TOKEN = token
        os.environ[ADMIN_TOKEN_ENV] = token

    def _engines(self, opts: dict[str, Any], var: Path) -> dict[str, dict[str, Any]]:
        """The engines to start, by child name: port, URL, engine id, round-record file. One
        engine is the entry point itself; replicas take the ports after it."""
        n, entry = opts["replicas"], opts["engine_port"]
        if n == 1:
            return {"engine": {"port": entry, "url": f"http://127.0.0.1:{entry}",
                               "engine_id": None, "rounds": var / "rounds.jsonl"}}  # fmt: skip
        engines = {}
        for i in range(1, n + 1):
            port = entry + i
            engines[f"engine-{i}"] = {
                "port": port,
                "url": f"http://127.0.0.1:{port}",
                "engine_id": f"sim-{i}",
                "rounds": var / f"rounds-sim-{i}.jsonl",
            }
        return engines

    def _market(self, engine_url: str, engines: dict[str, dict[str, Any]]) -> Market:
        """The demo market, pointed at the entry point this command starts, with its replicas
        (those of an earlier run that this one does not start are disabled). Nothing is pushed
        yet: the replicas' old addresses may be another run's engines, and this run's are not up
        (``_control_push`` does it once they are)."""
        market = market_demo_seed()
        Market.objects.filter(pk=market.pk).update(engine_url=engine_url, chat_template="simple")
        market.refresh_from_db()
        ids = [e["engine_id"] for e in engines.values() if e["engine_id"] is not None]
        for e in engines.values():
            if e["engine_id"] is not None:
                replica_set(market=market, engine_id=e["engine_id"], url=e["url"], push=False)
        Replica.objects.filter(market=market).exclude(engine_id__in=ids).update(enabled=False)
        return market

    def _control_push(self, market: Market, engines: dict[str, dict[str, Any]]) -> None:
        """The market's policy and reserve, as they are now, to the engines this run started
        (and that answer), each by its own URL (they also came on the command line: this
        catches a change made while they started)."""
        for name, engine in engines.items():
            try:
                outcome = engine_config_push(market_id=market.pk, engines=[engine["url"]])
            except EngineUnreachable as exc:
                self._report(f"{name}: market control not pushed ({exc})")
            else:
                self._report(f"{name}: market control {outcome} ({engine['url']})")

    def _agent_keys(self) -> dict[str, str]:
        """Fresh API keys for the agents (earlier runs' keys revoked); Globex gets an
        autobidder if it has none, so that its requests without a bid are paced."""
        keys = {}
        with transaction.atomic():
            for _name, slug, _login in DEMO_TENANTS:
                tenant = Tenant.objects.get(slug=slug)
                for old in ApiKey.objects.filter(
                    tenant=tenant, name=AGENT_KEY_NAME, revoked_at=None
                ):
                    api_key_revoke(api_key=old)
                _, keys[slug] = api_key_create(tenant=tenant, name=AGENT_KEY_NAME, created_by=None)
            globex = Tenant.objects.get(slug="globex")
            if not Autobidder.objects.filter(tenant=globex).exists():
                autobidder_configure(
                    tenant=globex,
                    enabled=True,
                    budget="5",
                    period="day",
                    values={"interactive": "0.05", "background": "0.005"},
                    max_wait_s=30.0,
                )
        return keys

    # --- processes ----------------------------------------------------------------------------

    def _engine_argv(
        self, market: Market, engine: dict[str, Any], redis_url: str | None
    ) -> list[str]:
        """A simulated engine's command line, with the market's policy and reserve as they
        are now (a restarted engine must not come back with those of the command's start;
        if the database cannot say, with those last read)."""
        close_old_connections()  # this thread's connection may have idled out long ago
        try:
            market.refresh_from_db(fields=["policy", "reserve"])
        except DatabaseError as exc:
            self._report(f"engine: cannot read the market's policy and reserve now ({exc})")
        argv = [
            sys.executable, "-m", "engines.sim.server", "--host", "127.0.0.1",
            "--port", str(engine["port"]), "--policy", market.policy,
            "--reserve", str(market.reserve), "--market", market.slug,
        ]  # fmt: skip
        if engine["engine_id"] is not None:
            argv += ["--engine-id", engine["engine_id"]]
        for setting in DEMO_ENGINE:
            argv += ["--set", setting]
        if redis_url:
            # The store has the console's latest values even if the database read above failed.
            return [*argv, "--redis-url", redis_url, "--follow-control"]
        return [*argv, "--rounds-jsonl", str(engine["rounds"])]

    def _start(self, name: str, argv: list[str], logs: Path) -> subprocess.Popen:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if name == "router":
            env = router_env(env)
        if name == "web" and settings.REDIS_URL:
            # Each worker counts its own requests; /metrics sums them (gateway.metrics). The
            # files of an earlier run's workers go first.
            shutil.rmtree(self._metrics_dir, ignore_errors=True)
            self._metrics_dir.mkdir(parents=True)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(self._metrics_dir)
        # The child writes to its own copy of the descriptor: closing ours after the start keeps
        # a child that is restarted again and again from leaking one per start.
        with open(logs / f"{name}.log", "ab") as log:
            return subprocess.Popen(
                argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip

    def _wait_http(self, url: str, name: str, proc: Process) -> None:
        try:
            http_wait(url, proc)
        except RuntimeError as exc:
            raise CommandError(f"{name}: {exc}; see var/logs/{name}.log") from None

    def _pace(self, stop: threading.Event) -> None:
        """Embedded mode: the autobidders' pacing steps, the markets' hold horizons, their
        automatic reserves and the holds sweep: beat's ``EMBEDDED_JOBS``, run in this thread."""
        from config.celery import app

        app.autodiscover_tasks(force=True)  # import the apps' tasks now, as a worker does
        jobs = [settings.CELERY_BEAT_SCHEDULE[name] for name in EMBEDDED_JOBS]
        due = [time.monotonic() + job["schedule"] for job in jobs]
        while not stop.wait(min(job["schedule"] for job in jobs)):
            for i, job in enumerate(jobs):
                if time.monotonic() < due[i]:
                    continue
                due[i] = time.monotonic() + job["schedule"]
                try:
                    app.tasks[job["task"]]()  # the task's body, in this process
                except Exception as exc:  # noqa: BLE001 (run again at its next interval)
                    self.stderr.write(f"{job['task']} failed: {exc}")

    def _report(self, line: str) -> None:
        """A child's exit or start, on the terminal (its own output is in its log)."""
        self.stdout.write(f"[{time.strftime('%H:%M:%S')}] {line}")
        self.stdout.flush()

    def _banner(self, base: str, market: Market, redis_url: str | None, logs: Path) -> None:
        replicas = market.replicas.filter(enabled=True).count()
        engines = (
            f"SGLang's model gateway (smg) in front of {replicas} simulated replicas"
            if replicas
            else "one simulated engine, real time"
        )
        mode = "PostgreSQL/Redis + Celery worker" if redis_url else "embedded defaults"
        lines = [
            "",
            f"The live market is running ({mode}):",
            f"  console       {base}/console/          (operator: {DEMO_OPERATOR.username} / "
            f"{DEMO_OPERATOR.password})",
        ]
        for _name, slug, login in DEMO_TENANTS:
            lines.append(
                f"  tenant {slug:<7}{base}/tenants/{slug}/dashboard/   ({login.username} / "
                f"{login.password})"
            )
        lines += [
            f"  API           {base}/v1  (model {market.served_model}; OpenAI-compatible)",
            f"  engine        {market.engine_url}  ({engines})",
            f"  logs          {logs}/",
            "Children that exit are started again; Ctrl-C stops everything.",
        ]
        self.stdout.write("\n".join(lines))
        self.stdout.flush()
