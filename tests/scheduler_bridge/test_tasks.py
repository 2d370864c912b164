"""Celery: the ping task in-process, and through the Redis broker in a real worker process; the
rounds task's result in-process (its runs by real workers: ``settlement/test_rounds_worker.py``)."""

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from django.conf import settings

from config.celery import app as celery_app
from scheduler_bridge.tasks import RENAMED, ping, rounds_consume
from tests.conftest import REPO_ROOT
from tests.scheduler_bridge.workers import celery_worker, wait_until

WORKER_START_TIMEOUT_S = 60


def test_ping_runs_in_process() -> None:
    result = ping.apply().get()
    assert result["pong"] is True
    assert result["pid"] == os.getpid()


def test_celery_is_eager_exactly_when_redis_is_unset() -> None:
    assert celery_app.conf.task_always_eager is (settings.REDIS_URL is None)
    if settings.REDIS_URL:
        assert celery_app.conf.broker_url == settings.REDIS_URL
        assert celery_app.conf.result_backend == settings.REDIS_URL


def test_the_rounds_task_reports_records_taken_and_no_money() -> None:
    """In this process, on an empty stream: the result counts records and admitted requests;
    nothing in it is money (round records move none)."""
    stream = f"imtest:rounds:{uuid.uuid4().hex[:12]}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        kwargs = {"stream": stream, "max_seconds": 5, "until_idle": True}
        result = rounds_consume.apply(kwargs=kwargs).get()
    finally:
        client.delete(stream)
        client.close()
    assert result == {
        "read": 0,
        "reclaimed": 0,
        "taken": 0,
        "dead": 0,
        "failed": 0,
        "trimmed": 0,
        "admitted": 0,
        "stalled": "",
    }


@dataclass(frozen=True)
class WorkerProcess:
    name: str  # Celery node name, "name@host"
    queue: str  # the only queue it consumes
    pid: int
    log: Path


@pytest.fixture(scope="session")
def celery_worker_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A real ``celery worker`` subprocess on a queue of its own, with this process's env."""
    if not settings.REDIS_URL:
        pytest.skip("needs Redis: set REDIS_URL=redis://... (.ci/run does)")
    token = uuid.uuid4().hex[:12]
    name, queue = f"imtest-{token}@pytest", f"imtest-{token}"
    log = tmp_path_factory.mktemp("celery") / "worker.log"
    with log.open("w") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "--pool=solo",
                "--concurrency=1",
                "-Q",
                queue,
                "-n",
                name,
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "--loglevel=INFO",
            ],
            cwd=REPO_ROOT,
            env=os.environ.copy(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while not celery_app.control.ping(destination=[name], timeout=1.0):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"celery worker did not come up; its log:\n{log.read_text()}")
        yield WorkerProcess(name=name, queue=queue, pid=process.pid, log=log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        client = redis.Redis.from_url(settings.REDIS_URL)
        client.delete(f"_kombu.binding.{queue}", queue)
        client.close()


@pytest.mark.celery_worker
def test_ping_through_the_redis_broker_by_a_real_worker(
    celery_worker_process: WorkerProcess,
) -> None:
    assert celery_app.conf.task_always_eager is False
    result = ping.apply_async(queue=celery_worker_process.queue)
    answer = result.get(timeout=30)
    assert answer == {
        "pong": True,
        "worker": celery_worker_process.name,
        "pid": celery_worker_process.pid,
    }
    assert answer["pid"] != os.getpid()


def test_each_task_is_named_for_its_package_and_the_old_names_still_route() -> None:
    """Beat queues tasks by the names of the packages that hold them; every name a task once had
    (``scheduler_bridge.*`` before the move) is still registered, forwarding to a real task."""
    celery_app.loader.import_default_modules()
    registered = set(celery_app.tasks)
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["task"] in registered, entry
        assert entry["task"] not in RENAMED, f"beat queues {entry['task']} by its old name"
    owners = {
        "market.live_publish": "market.tasks",
        "market.hold_horizons_renew": "market.tasks",
        "market.engine_config_push": "market.tasks",
        "accounts.autobidders_step": "accounts.tasks",
        "accounts.holds_sweep": "accounts.tasks",
        "accounts.invoices_generate": "accounts.tasks",
        "openai_api.batch_run": "openai_api.batches.tasks",
    }
    assert sorted(RENAMED.values()) == sorted(owners)
    for old, new in RENAMED.items():
        assert old.startswith("scheduler_bridge.") and old in registered
        assert celery_app.tasks[new].__module__ == owners[new], new


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
def test_a_message_queued_under_an_old_name_runs_the_renamed_task(tmp_path: Path) -> None:
    """A message queued before the upgrade (``scheduler_bridge.invoices_generate``) reaches a
    worker of this release, which forwards it to ``accounts.invoices_generate`` on the same
    queue: the invoicing run happens once, with the previous month's period."""
    with celery_worker(tmp_path) as worker:
        forwarded_id = celery_app.send_task(
            "scheduler_bridge.invoices_generate", queue=worker.queue
        ).get(timeout=60)
        outcome = celery_app.AsyncResult(forwarded_id).get(timeout=60)
        # The worker stores the result before it logs the success: wait for the line.
        succeeded = f"Task accounts.invoices_generate[{forwarded_id}] succeeded"
        wait_until(lambda: succeeded in worker.log.read_text(), what="the success logged")
        log = worker.log.read_text()
    this_month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last_month = (this_month - timedelta(days=1)).replace(day=1)
    assert (outcome["period_start"], outcome["period_end"]) == (
        last_month.isoformat(),
        this_month.isoformat(),
    )
    assert succeeded in log, log
