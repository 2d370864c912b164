"""How the ASGI application is served: one place for the command lines of the servers the project
runs (``manage.py live_market``, ``benchmarks.gateway``, the production
recipe), so that what is measured is what is run.

- **uvicorn** (the default in production): uvloop's event loop and httptools' HTTP parser, with
  ``websockets`` for ``/ws/``. ``--workers N`` forks N processes behind one socket; they share
  nothing in memory, so several need Redis (``REDIS_URL``: the channel layer, the cache, Celery)
  and PostgreSQL. ``--lifespan on``: Django has no lifespan protocol, the gateway's (its stop:
  the requests cut off after ``--timeout-graceful-shutdown`` release their holds before the
  worker exits).
- **granian** (Rust's hyper underneath), the ASGI interface without lifespan (``asginl``),
  uvloop, N worker processes.
- **daphne**, one process (Twisted): the benchmark's reference point.

Access logs are off on every server (a line per request is a tail-latency cost; the gateway's
Prometheus metrics count the answers).
"""

from __future__ import annotations

import sys
from pathlib import Path

APPLICATION = "config.asgi:application"
SERVERS = ("uvicorn", "granian", "daphne")
# Servers that fork worker processes (Daphne serves from one).
MULTI_WORKER_SERVERS = frozenset({"uvicorn", "granian"})
# uvicorn's stop: how long it lets the requests in flight finish, seconds, before it cancels the
# rest (the gateway then releases their holds: lifespan shutdown, openai_api.gateway.asgi); with
# that release (at most 3 s), under supervisord's stopwaitsecs (10 s), which kills the group.
GRACEFUL_SHUTDOWN_S = 5


def server_argv(
    server: str,
    *,
    host: str,
    port: int,
    workers: int = 1,
    python: str | None = None,
    application: str = APPLICATION,
) -> list[str]:
    """The command line that serves ``application`` (the project's, :data:`APPLICATION`) on
    ``host:port`` with ``server`` (one of :data:`SERVERS`) and ``workers`` processes;
    ``python``: the interpreter (this one when None)."""
    if server not in SERVERS:
        raise ValueError(f"unknown server {server!r}; choose one of {', '.join(SERVERS)}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers > 1 and server not in MULTI_WORKER_SERVERS:
        raise ValueError(f"{server} serves from one process: workers must be 1, got {workers}")
    python = python or sys.executable
    if server == "uvicorn":
        return [
            python, "-m", "uvicorn", application, "--host", host, "--port", str(port),
            "--workers", str(workers), "--loop", "uvloop", "--http", "httptools",
            "--ws", "websockets-sansio", "--lifespan", "on", "--no-access-log",
            "--log-level", "warning", "--timeout-graceful-shutdown", str(GRACEFUL_SHUTDOWN_S),
        ]  # fmt: skip
    if server == "granian":
        return [
            str(Path(python).parent / "granian"), "--interface", "asginl", "--host", host,
            "--port", str(port), "--workers", str(workers), "--loop", "uvloop",
            "--no-access-log", "--log-level", "warning", application,
        ]  # fmt: skip
    return [python, "-m", "daphne", "-b", host, "-p", str(port), "-v", "0", application]
