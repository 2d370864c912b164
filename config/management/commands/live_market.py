"""``manage.py live_market``: the whole live market in one command (what ``make run`` runs).

It sets the market up, then runs it under supervisord (``supervisord -n``, its one child), with
one program per process, started in this order:

- the market's engines: by default two simulated replicas in real time (``engines.sim.server``)
  behind SGLang's model gateway, smg (``engines.router``, ``--router-policy``), on
  ``--engine-port``, the market's entry point; with ``--replicas 1``, one engine there and no
  gateway. The replicas are the market's (``market.Replica``), so the console's controls and
  status reach each. Engines write their round records to the Redis stream and follow the
  market's control store, which this command writes before they start;
- the web server, ``--web-server`` (uvicorn by default, ``config.serving``) with
  ``--web-workers`` processes (2), a Celery worker and celery beat (round records from the
  stream, pacing, the live publishers);
- a load of agents bidding through the gateway (``benchmarks.agents``) with fresh API
  keys of the demo tenants; Globex's requests send no bid and go through its autobidder (seeded
  by ``seed_demo`` with a budget that binds: its dashboard shows mu and the spend path). The demo
  engines are small (``DEMO_ENGINE``: a few requests running at a time) and the agents size
  their load to what the engines serve, measured as they start (``--load``, 0.85 x capacity),
  so that the console shows what the market is for: queues, subtrees competing in the book,
  priority charges, on any machine, without waits that only grow.

Before anything starts (and before the database is touched), every port the run will listen on
is checked (``--check-ports`` checks them and exits: ``make run`` does that first): one in use,
by another live market say, stops the command with a message naming the port and the option
(and ``make run`` variable) that moves it. No engine is sent anything: the engines an earlier
run (or another live market sharing the database) left in the market's replicas are not touched.

supervisord's file is ``var/supervisord.conf`` (``--write-config PATH`` only writes it, for a
deployment on one host): each program restarted whenever it exits, each started through
``config.launch`` (which stops what its previous run left in its process group first) and
stopped with its whole group; the run's secrets (the engine admin token, made for the run when
``ENGINE_ADMIN_TOKEN`` is not set, and the agents' API keys) are in its ``environment=``
lines, not on command lines. Logs go to ``var/logs/``; supervisord's own (every start and exit
of a program) to the terminal too. Ctrl-C, SIGTERM or SIGHUP stops everything.

The engine admin token is smg's control-plane key too (``engines.router``): who may add,
remove or flush the market's engines through the gateway is who may already pause and set
them one by one on their control path, so one secret serves both, and this command already
has it (it waits for the replicas in smg with it, ``GET /workers``). Without it smg answers
401 to ``POST /workers``, ``DELETE /workers/{id}`` and ``/flush_cache``, on any address.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from accounts.models import ApiKey, Tenant
from accounts.services import DEMO_OPERATOR, DEMO_TENANTS, api_key_create, api_key_revoke
from accounts.services.tenants import DEMO_AUTOBID_TENANT
from config.serving import MULTI_WORKER_SERVERS, SERVERS, server_argv
from engines.contract.wire import ADMIN_TOKEN_ENV
from engines.router import DEFAULT_POLICY as ROUTER_POLICY
from engines.router import POLICIES as ROUTER_POLICIES
from engines.router import RouterOptions, http_wait, router_argv, router_env, router_wait
from market.engine_control import control_publish
from market.models import Market, Replica
from market.services import market_demo_seed, replica_set

ROOT = Path(settings.BASE_DIR)
AGENT_KEY_NAME = "live-market agents"
# The demo's engines: a small deployment (a few requests at a time, a slow decode), so that the
# agents' load queues requests and the auction has something to order.
DEMO_ENGINE = ("max_running_requests=4", "step_fixed_s=0.03")
# The agents' load, x the engines' capacity that they measure at start (benchmarks.agents): a
# queue forms and bids order it, without waits that only grow.
DEMO_LOAD = 0.85
AGENT_KEYS_ENV = "AGENT_KEYS"  # where benchmarks.agents reads its keys (KEYS_ENV)
STOP_WAIT_S = 10  # a program's group gets SIGKILL this long after SIGTERM


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


def _environment(values: dict[str, str]) -> str:
    """supervisord's ``environment=`` value (quoted, ``%`` escaped)."""
    return ",".join(f'{k}="{v}"'.replace("%", "%%") for k, v in values.items())


# The demo's routing is the fleet's, smg's prefix_hash (ROUTER_POLICY), with an overload test of
# its own. smg's (1.13) moves a request off its prefix's replica when that replica's requests in
# flight are above 1.25 x the mean and above the mean + 10: with two replicas, only once it holds
# 22 more than the other (the mean counts the incoming request), five batches of these engines
# (DEMO_ENGINE). The demo's agents share two system prompts, one per tenant, and on engine ports
# 30000 and 36000 both hash to the same replica: it held 17.6 and 20.8 requests waiting on
# average, the other 0.05 and 1.6. Here a replica keeps its prefixes while its load is at most
# the mean (the incoming request counted: with two replicas, at most one more than the other),
# the rest go to the least loaded; two prompts fit in both replicas' caches. Measured at 42.4
# sessions a minute: 3.1 and 2.1 waiting, TTFT p50 1.03 s and p99 9.8 s, where cache_aware had
# 4.8 and 3.7, 1.93 s and 13.4 s (docs/engines.md, "Replicas behind SGLang's model gateway").
DEMO_PREFIX_HASH_ABS_THRESHOLD = 0
DEMO_PREFIX_HASH_LOAD_FACTOR = 1.0


class Command(BaseCommand):
    help = "Run the live market: engines, web server, Celery worker and beat, bidding agents."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--engine-port", type=int, default=30000,
            help="the market's entry point: the router, or the one engine (replicas on the "
            "next ports, then the router's Prometheus exporter)",
        )  # fmt: skip
        parser.add_argument("--replicas", type=int, default=2, help="simulated replicas")
        parser.add_argument(
            "--router-policy", default=ROUTER_POLICY, choices=ROUTER_POLICIES,
            help=f"smg's routing ({ROUTER_POLICY}, the fleet's)",
        )  # fmt: skip
        parser.add_argument(
            "--load", type=float, default=DEMO_LOAD,
            help="the agents' load, x the engines' capacity measured at start",
        )  # fmt: skip
        parser.add_argument(
            "--sessions-per-minute", type=float, default=None,
            help="the agents' sessions per minute, instead of --load",
        )  # fmt: skip
        parser.add_argument("--no-agents", action="store_true", help="no load generator")
        parser.add_argument("--web-server", choices=SERVERS, default="uvicorn")
        parser.add_argument(
            "--web-workers", type=int, default=2, help="the web server's processes (uvicorn...)"
        )
        parser.add_argument(
            "--var", type=Path, default=ROOT / "var",
            help="logs, supervisord's file and state (var/)",
        )  # fmt: skip
        parser.add_argument(
            "--write-config", type=Path, metavar="PATH",
            help="set up the market, write the supervisord file to PATH and exit (start it "
            "with supervisord -c PATH)",
        )  # fmt: skip
        parser.add_argument(
            "--check-ports", action="store_true",
            help="only check that every port this run would listen on is free, then exit",
        )  # fmt: skip

    def handle(self, *args: Any, **opts: Any) -> None:
        var = opts["var"].resolve()
        if opts["replicas"] < 1:
            raise CommandError("--replicas must be at least 1")
        if opts["web_workers"] < 1:
            raise CommandError("--web-workers must be at least 1")
        if opts["web_server"] not in MULTI_WORKER_SERVERS:
            opts["web_workers"] = 1
        self._ports_check(opts)
        if opts["check_ports"]:
            return
        if not settings.REDIS_URL:
            raise CommandError("REDIS_URL is not set: the live market needs Redis")
        token = settings.ENGINE_ADMIN_TOKEN or secrets.token_urlsafe(32)
        engines = self._engines(opts)
        market = self._market(f"http://127.0.0.1:{opts['engine_port']}", engines)
        control_publish(market)  # what every engine reads as it starts, and follows
        base = f"http://{opts['host']}:{opts['port']}"
        keys = {} if opts["no_agents"] else self._agent_keys()
        path = opts["write_config"] or var / "supervisord.conf"
        shutil.rmtree(var / "run", ignore_errors=True)  # an earlier run's pids are not ours
        for directory in (var / "run", var / "logs"):
            directory.mkdir(parents=True, exist_ok=True)
        config = self._config(opts, var, market, engines, keys, token, base)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)  # secrets: readable by this user only
        path.write_text(config)
        if opts["write_config"]:
            self.stdout.write(f"wrote {path}; run it with: supervisord -n -c {path}")
            return
        self._run(path, opts, market, engines, base, var, token)

    def _run(
        self,
        path: Path,
        opts: dict[str, Any],
        market: Market,
        engines: dict[str, dict[str, Any]],
        base: str,
        var: Path,
        token: str,
    ) -> None:
        """supervisord in the foreground, as this command's one child, until it exits;
        Ctrl-C, SIGTERM and SIGHUP stop it, and it stops every program (whole groups). It is in
        a process group of its own: the terminal's signals reach this command only (SIGHUP
        would make supervisord reload)."""
        supervisord = Path(sys.executable).with_name("supervisord")
        argv = [str(supervisord), "-n", "-c", str(path)]
        proc = subprocess.Popen(argv, cwd=ROOT, process_group=0)

        stopping = []

        def stop(signum: int, frame: object) -> None:
            stopping.append(signum)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, stop)
        try:
            for engine in engines.values():
                http_wait(f"{engine['url']}/health", proc)
            if len(engines) > 1:
                router_wait(
                    market.engine_url, len(engines), proc, timeout_s=60.0, control_key=token
                )
            http_wait(f"{base}/healthz", proc)
        except RuntimeError as exc:
            if stopping:  # stopped while it started: no error
                proc.wait()
                return
            stop(signal.SIGTERM, None)
            proc.wait()
            raise CommandError(f"{exc}; see {var / 'logs'}/") from None
        self._banner(base, market, var / "logs", path)
        if proc.wait() != 0 and not stopping:
            raise CommandError(f"supervisord exited with {proc.returncode}")

    def _config(
        self,
        opts: dict[str, Any],
        var: Path,
        market: Market,
        engines: dict[str, dict[str, Any]],
        keys: dict[str, str],
        token: str,
        base: str,
    ) -> str:
        """The supervisord file: one program per process, started in order of priority (and
        stopped in the reverse order), each restarted whenever it exits, each stopped with its
        whole process group."""
        py = sys.executable
        after: list[str] = []  # what smg waits for: the replicas that do not answer are dropped
        programs: list[tuple[str, list[str], dict[str, str]]] = [
            (name, self._engine_argv(market, e), {}) for name, e in engines.items()
        ]
        if len(engines) > 1:
            router = RouterOptions(
                port=opts["engine_port"],
                worker_urls=tuple(e["url"] for e in engines.values()),
                policy=opts["router_policy"],
                prefix_hash_balance_abs_threshold=DEMO_PREFIX_HASH_ABS_THRESHOLD,
                prefix_hash_load_factor=DEMO_PREFIX_HASH_LOAD_FACTOR,
                prometheus_port=opts["engine_port"] + len(engines) + 1,
                control_key=token,
            )  # the market's routing settings (engines.router), as the replicas benchmark chose
            env = router_env(os.environ, router)  # its control key among it: not on its command
            added = {k: v for k, v in env.items() if os.environ.get(k) != v}
            programs.append(("router", router_argv(router), added))
            after = [f"{e['url']}/health" for e in engines.values()]
        web = server_argv(opts["web_server"], host=opts["host"], port=opts["port"],
                          workers=opts["web_workers"])  # fmt: skip
        # Each worker counts its own requests; /metrics sums them (gateway.metrics).
        metrics = {"PROMETHEUS_MULTIPROC_DIR": str(var / "prometheus")}
        programs += [
            ("web", web, metrics),
            ("worker", [py, "-m", "celery", "-A", "config", "worker", "--loglevel=WARNING",
                        "--concurrency=2"], {}),
            ("beat", [py, "-m", "celery", "-A", "config", "beat", "--loglevel=WARNING",
                      "--schedule", str(var / "celerybeat-schedule")], {}),
        ]  # fmt: skip
        if keys:
            agents = [py, "-m", "benchmarks.agents", "--base-url", f"{base}/v1",
                      "--model", market.served_model, "--autobid", DEMO_AUTOBID_TENANT]  # fmt: skip
            if opts["sessions_per_minute"] is not None:
                agents += ["--sessions-per-minute", str(opts["sessions_per_minute"])]
            else:
                agents += ["--load", str(opts["load"])]
            secret = " ".join(f"{slug}={key}" for slug, key in keys.items())
            programs.append(("agents", agents, {AGENT_KEYS_ENV: secret}))
        sections = [
            "; The live market on one host, written by `manage.py live_market` "
            "(docs/operations.md).",
            f"; Run: supervisord -n -c {opts['write_config'] or var / 'supervisord.conf'}",
            "[supervisord]",
            f"logfile={var / 'logs' / 'supervisord.log'}",
            f"pidfile={var / 'run' / 'supervisord.pid'}",
            f"directory={ROOT}",
            f"environment={_environment({ADMIN_TOKEN_ENV: token, 'PYTHONUNBUFFERED': '1'})}",
            "[unix_http_server]",
            f"file={var / 'run' / 'supervisor.sock'}",
            "chmod=0700",
            "[supervisorctl]",
            f"serverurl=unix://{var / 'run' / 'supervisor.sock'}",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        ]
        for priority, (name, argv, env) in enumerate(programs, start=1):
            launch = [py, "-m", "config.launch", "--pidfile", str(var / "run" / f"{name}.pid")]
            if "PROMETHEUS_MULTIPROC_DIR" in env:
                launch += ["--fresh", env["PROMETHEUS_MULTIPROC_DIR"]]
            if name == "router":
                launch += [a for url in after for a in ("--after", url)]
            sections += [
                f"[program:{name}]",
                f"command={shlex.join([*launch, '--', *argv]).replace('%', '%%')}",
                f"priority={priority * 10}",
                "autorestart=true",
                "startsecs=1",
                "startretries=1000",
                "stopasgroup=true",
                "killasgroup=true",
                f"stopwaitsecs={STOP_WAIT_S}",
                "redirect_stderr=true",
                f"stdout_logfile={var / 'logs' / f'{name}.log'}",
            ]
            if env:
                sections.append(f"environment={_environment(env)}")
        return "\n".join(sections) + "\n"

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
        what = "smg's Prometheus exporter, on the port after the replicas'"
        return [*ports, ("127.0.0.1", first + n + 1, what, entry)]

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

    def _engines(self, opts: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The engines to start, by program name: port, URL, engine id. One engine is the entry
        point itself; replicas take the ports after it."""
        n, entry = opts["replicas"], opts["engine_port"]
        if n == 1:
            return {"engine": {"port": entry, "url": f"http://127.0.0.1:{entry}",
                               "engine_id": None}}  # fmt: skip
        return {
            f"engine-{i}": {
                "port": entry + i, "url": f"http://127.0.0.1:{entry + i}", "engine_id": f"sim-{i}"
            }
            for i in range(1, n + 1)
        }  # fmt: skip

    def _market(self, engine_url: str, engines: dict[str, dict[str, Any]]) -> Market:
        """The demo market, pointed at the entry point this command starts, with its replicas
        (those of an earlier run that this one does not start are disabled). Nothing is pushed
        to any engine: the replicas' old addresses may be another run's engines; this run's
        read the market's control from the store as they start, and follow it."""
        market = market_demo_seed()
        Market.objects.filter(pk=market.pk).update(engine_url=engine_url, chat_template="simple")
        market.refresh_from_db()
        ids = [e["engine_id"] for e in engines.values() if e["engine_id"] is not None]
        for e in engines.values():
            if e["engine_id"] is not None:
                replica_set(market=market, engine_id=e["engine_id"], url=e["url"], push=False)
        Replica.objects.filter(market=market).exclude(engine_id__in=ids).update(enabled=False)
        return market

    def _agent_keys(self) -> dict[str, str]:
        """Fresh API keys for the agents (earlier runs' keys revoked)."""
        keys = {}
        with transaction.atomic():
            for _name, slug, _login in DEMO_TENANTS:
                tenant = Tenant.objects.get(slug=slug)
                for old in ApiKey.objects.filter(
                    tenant=tenant, name=AGENT_KEY_NAME, revoked_at=None
                ):
                    api_key_revoke(api_key=old)
                _, keys[slug] = api_key_create(tenant=tenant, name=AGENT_KEY_NAME, created_by=None)
        return keys

    def _engine_argv(self, market: Market, engine: dict[str, Any]) -> list[str]:
        """A simulated engine's command line. It follows the market's control store, so a
        restarted engine runs with the market's policy and reserve as they are then (those
        given here count only until the store is read)."""
        argv = [
            sys.executable, "-m", "engines.sim.server", "--host", "127.0.0.1",
            "--port", str(engine["port"]), "--policy", market.policy,
            "--reserve", str(market.reserve), "--market", market.slug,
            "--redis-url", settings.REDIS_URL, "--follow-control",
        ]  # fmt: skip
        if engine["engine_id"] is not None:
            argv += ["--engine-id", engine["engine_id"]]
        for setting in DEMO_ENGINE:
            argv += ["--set", setting]
        return argv

    def _banner(self, base: str, market: Market, logs: Path, config: Path) -> None:
        replicas = market.replicas.filter(enabled=True).count()
        engines = (
            f"SGLang's model gateway (smg) in front of {replicas} simulated replicas"
            if replicas
            else "one simulated engine, real time"
        )
        lines = [
            "",
            "The live market is running:",
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
            f"  supervisord   {config}  (supervisorctl -c {config} status)",
            "Programs that exit are started again; Ctrl-C stops everything.",
        ]
        self.stdout.write("\n".join(lines))
        self.stdout.flush()
