"""Real Celery worker processes for tests that depend on a worker's behaviour.

Like ``test_tasks.celery_worker_process``, but the worker shares the test process's *test*
database (pytest-django's ``test_<name>``; the tests use ``transactional_db`` so what they write
is committed and visible to it), listens on a queue of its own, and can be killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from celery import Celery
from django.conf import settings
from django.db import connection

from config.celery import app as celery_app
from tests.conftest import REPO_ROOT

WORKER_START_TIMEOUT_S = 60


@dataclass
class Worker:
    """A running ``celery worker``; ``process`` is its main process."""

    name: str  # Celery node name, "name@host"
    queue: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL the whole worker: no shutdown, no acknowledgement, nothing flushed."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def children(self) -> list[int]:
        """Pids of the worker's pool processes (prefork)."""
        path = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []


def worker_database_url() -> str:
    """``DATABASE_URL`` of the database this test process uses (the test database)."""
    db = connection.settings_dict
    assert db["ENGINE"] == "django.db.backends.postgresql", "worker tests need PostgreSQL"
    user = quote(db["USER"] or "", safe="")
    password = f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else ""
    auth = f"{user}{password}@" if user else ""
    return f"postgres://{auth}{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"


@contextlib.contextmanager
def celery_worker(
    log_dir: Path,
    *,
    pool: str = "solo",
    concurrency: int = 1,
    env: Mapping[str, str] | None = None,
    control: Celery = celery_app,
) -> Iterator[Worker]:
    """Start a worker on a fresh queue against the test database; stop it (or reap it) after.
    ``control`` is the app that sees it come up: one on the worker's broker when ``env`` gives
    it a ``REDIS_URL`` of its own."""
    token = uuid.uuid4().hex[:12]
    name, queue = f"imtest-{token}@pytest", f"imtest-{token}"
    log = log_dir / f"worker-{token}.log"
    environ = os.environ.copy() | {"DATABASE_URL": worker_database_url()} | dict(env or {})
    environ["TEST_PAUSE_HOOKS"] = "1"  # tests.pause_hooks registers what ``env`` asks for
    with log.open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "worker", f"--pool={pool}",
             f"--concurrency={concurrency}", "-Q", queue, "-n", name, "--without-heartbeat",
             "--without-gossip", "--without-mingle", "--loglevel=INFO",
             "--include=tests.pause_hooks"],
            cwd=REPO_ROOT, env=environ, stdout=log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip
    worker = Worker(name=name, queue=queue, process=process, log=log)
    try:
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while not control.control.ping(destination=[name], timeout=1.0):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"celery worker did not come up; its log:\n{log.read_text()}")
        yield worker
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        queue_forget(queue)


def queue_forget(queue: str) -> None:
    """Delete the queue and the unacknowledged messages a killed worker left for it."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        client.delete(f"_kombu.binding.{queue}", queue)
        for tag, payload in client.hscan_iter("unacked"):
            with contextlib.suppress(ValueError, IndexError, TypeError):
                if json.loads(payload)[2] == queue:  # [message, exchange, routing key]
                    client.hdel("unacked", tag)
                    client.zrem("unacked_index", tag)
    finally:
        client.close()


def wait_until(condition: Callable[[], object], *, timeout_s: float = 30, what: str = "") -> None:
    """Poll ``condition`` every 50 ms until it is true; fail after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what or condition}")
        time.sleep(0.05)
