"""The checkout's own PostgreSQL and Redis (``config.local_services``): real servers from the
pip-installed binaries, in a folder of the test's own, started, shared, taken over and stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psycopg
import pytest
import redis

from config import local_services
from tests.conftest import REPO_ROOT


def _answers(running: local_services.Running) -> bool:
    try:
        if running.variable == "DATABASE_URL":
            with psycopg.connect(running.url, connect_timeout=2) as conn:
                return conn.execute("SELECT 1").fetchone() == (1,)
        return redis.Redis.from_url(running.url, socket_connect_timeout=2).ping()
    except (psycopg.OperationalError, redis.RedisError):
        return False


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def folder(tmp_path_factory):
    # The PostgreSQL user must reach the data folder: a folder of its own under /tmp.
    return tmp_path_factory.mktemp("services")


def test_unset_urls_get_servers_that_answer_and_stop_at_the_end(folder) -> None:
    environ: dict[str, str] = {}
    running = local_services.services_start(environ, folder)
    try:
        assert [r.variable for r in running] == ["DATABASE_URL", "REDIS_URL"]
        assert environ["DATABASE_URL"].startswith("postgres://postgres@127.0.0.1:")
        assert environ["DATABASE_URL"].endswith("/market")
        assert environ["REDIS_URL"].startswith("redis://127.0.0.1:")
        assert all(_answers(r) for r in running)
        # The machine's own services are not the ones used.
        assert ":5432/" not in environ["DATABASE_URL"] and ":6379/" not in environ["REDIS_URL"]
    finally:
        local_services.services_stop(running)
    assert all(_gone(r.pid) for r in running)
    assert not any(_answers(r) for r in running)


def test_a_set_url_is_left_alone(folder) -> None:
    environ = {"DATABASE_URL": "postgres://app@db.example/market"}
    running = local_services.services_start(environ, folder)
    try:
        assert [r.variable for r in running] == ["REDIS_URL"]
        assert environ["DATABASE_URL"] == "postgres://app@db.example/market"
        assert not (folder / "postgres").exists()
    finally:
        local_services.services_stop(running)


def test_a_second_command_shares_them_and_takes_over_when_the_first_is_gone(folder) -> None:
    # The first command: a child process that starts the services and is then killed.
    code = (
        "import sys, time; from pathlib import Path; from config import local_services as s;"
        "env = {}; s.services_start(env, Path(sys.argv[1]));"
        "print(env['DATABASE_URL'], env['REDIS_URL'], flush=True); time.sleep(120)"
    )
    first = subprocess.Popen(
        [sys.executable, "-c", code, str(folder)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    lines = iter(first.stdout.readline, "")
    urls = next(line for line in lines if not line.startswith("local services:")).split()
    assert len(urls) == 2, "the first command did not start the services"
    shared = local_services.services_start({}, folder)
    assert [r.url for r in shared] == urls
    assert all(r.pid is None for r in shared)  # shared: not this command's to stop
    local_services.services_stop(shared)
    assert all(_answers(r) for r in shared)
    first.kill()
    first.wait()
    taken = local_services.services_start({}, folder)
    try:
        assert [r.url for r in taken] == urls
        assert all(r.pid is not None and not r.started for r in taken)
    finally:
        local_services.services_stop(taken)
    assert all(_gone(r.pid) for r in taken)


def test_the_command_gets_the_urls_and_its_exit_status() -> None:
    # The checkout's own folder (var/services), as `make test` uses it.
    code = "import os, sys; print(os.environ['DATABASE_URL']); sys.exit(3)"
    result = subprocess.run(
        [sys.executable, "-m", "config.local_services", "--", sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout.splitlines()[-1].startswith("postgres://postgres@127.0.0.1:")
