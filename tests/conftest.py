"""Shared fixtures. Every test runs against the real PostgreSQL and Redis of DATABASE_URL and
REDIS_URL (``make test`` starts the checkout's own when they are unset). Under ``CI=true`` any
skip fails the run (tests/ci_policy.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from engines.contract.wire import ADMIN_TOKEN_ENV
from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
from tests import ci_policy

REPO_ROOT = Path(__file__).resolve().parents[1]
# An engine's control is closed without an admin token. The tests' market holds this one, as a
# deployment holds its own: the market's pushes send it (settings and subprocesses alike), and
# the simulated engines the tests start for a market ask for it (``start_sim``).
ENGINE_ADMIN_TOKEN = "tests-engine-admin-token"


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    ci_policy.register(config)
    os.environ[ADMIN_TOKEN_ENV] = ENGINE_ADMIN_TOKEN
    settings.ENGINE_ADMIN_TOKEN = ENGINE_ADMIN_TOKEN


@pytest.fixture(autouse=True)
def fresh_channel_layers() -> Iterator[None]:
    """Give each test its own channel-layer instances.

    channels caches one layer per alias for the process, and a Redis layer remembers the event
    loop that first received on it; pytest-asyncio runs each test on a new loop, so a layer kept
    from an earlier test refuses to receive ("Two event loops are trying to receive()").
    """
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def dead_port() -> int:
    """A loopback TCP port nothing listens on (it was free a moment ago)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


ManageRunner = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_manage() -> ManageRunner:
    """Run ``manage.py`` in a fresh process with this one's environment, ``env`` on top and the
    variables in ``unset`` removed."""

    def run(
        *args: str, env: Mapping[str, str] | None = None, unset: tuple[str, ...] = ()
    ) -> subprocess.CompletedProcess[str]:
        environ = {k: v for k, v in os.environ.items() if k not in unset}
        environ.update(env or {})
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO_ROOT,
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


class DaphneThread:
    """Daphne serving ``config.asgi.application`` on 127.0.0.1, in a daemon thread."""

    def __init__(self) -> None:
        self.port: int | None = None
        self._server = None
        self._thread: threading.Thread | None = None

    def start(self) -> DaphneThread:
        from daphne.server import Server
        from twisted.internet import reactor

        from config.asgi import application

        ready = threading.Event()
        self._server = Server(
            application,
            endpoints=["tcp:port=0:interface=127.0.0.1"],
            signal_handlers=False,
            verbosity=0,
            ready_callable=ready.set,
        )
        self._thread = threading.Thread(target=self._server.run, name="daphne", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("Daphne did not start")
        for _ in range(200):
            if self._server.listening_addresses:
                break
            threading.Event().wait(0.05)
        else:
            raise RuntimeError("Daphne did not listen")
        self.port = self._server.listening_addresses[0][1]
        self._reactor = reactor
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def loop(self):
        """The asyncio loop Twisted's reactor runs on: the one serving the websockets."""
        return self._reactor._asyncioEventloop

    def stop(self) -> None:
        import asyncio

        from engines.client import engine_client

        # Close the engine client's pooled connections on the server's loop while it runs.
        closing = asyncio.run_coroutine_threadsafe(engine_client().aclose(), self.loop)
        closing.result(timeout=10)
        self._reactor.callFromThread(self._reactor.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)


@pytest.fixture(scope="session")
def asgi_server(django_db_setup, django_db_blocker) -> Iterator[DaphneThread]:
    """The ASGI app served by Daphne in a thread of this process, on a free port, for the whole
    session (the gateway's tests and the browser tests share it: Twisted's reactor runs once per
    process). It shares the test database; the gateway's database threads are closed before the
    test database is dropped."""
    from openai_api.gateway import db as gateway_db

    server = DaphneThread().start()
    yield server
    server.stop()
    with django_db_blocker.unblock():
        gateway_db.connections_close()


# --- simulated engines on real ports (the engines', the gateway's and the batches' tests) -----

# Steps take 1/SPEED of their modelled time; reported times stay in engine seconds.
SPEED = 20.0

StartSim = Callable[..., ServerThread]


@pytest.fixture
def start_sim() -> Iterator[StartSim]:
    """Start a simulated engine in a background thread with the given ServerOptions fields
    (port 0: a free port; speed SPEED and the tests' admin token unless given); stopped after
    the test."""
    started: list[ServerThread] = []

    def start(**fields) -> ServerThread:
        fields.setdefault("port", 0)
        fields.setdefault("speed", SPEED)
        fields.setdefault("admin_token", ENGINE_ADMIN_TOKEN)
        fields["settings"] = tuple(fields.get("settings", ()))
        sim = ServerThread(ServerOptions.of(**fields)).start()
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


@pytest.fixture
def unique_slug() -> str:
    """A market slug no other test (or run sharing this Redis) uses."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def eager() -> Iterator[None]:
    """Celery tasks run in this process (the embedded mode), whatever REDIS_URL says."""
    from config.celery import app as celery_app

    before = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = before
