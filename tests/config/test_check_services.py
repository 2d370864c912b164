"""``manage.py check_services``: a line per service; a clear message and exit 1 for a dead one."""

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.conftest import dead_port

PASSWORD = "s3cretPassw0rd"


def test_dead_postgres_gives_a_clear_message(run_manage) -> None:
    port = dead_port()
    result = run_manage(
        "check_services", env={"DATABASE_URL": f"postgres://app:{PASSWORD}@127.0.0.1:{port}/market"}
    )
    assert result.returncode == 1
    assert (
        f"PostgreSQL at 127.0.0.1:{port}/market is unreachable: connection refused. "
        "Start it or fix DATABASE_URL."
    ) in result.stderr
    assert "Traceback" not in result.stderr
    assert PASSWORD not in result.stdout + result.stderr


def test_dead_redis_gives_a_clear_message(run_manage, tmp_path: Path) -> None:
    port = dead_port()
    result = run_manage(
        "check_services",
        env={
            "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3",
            "REDIS_URL": f"redis://:{PASSWORD}@127.0.0.1:{port}/0",
        },
    )
    assert result.returncode == 1
    assert f"SQLite at {tmp_path}/db.sqlite3: ok" in result.stdout
    assert (
        f"Redis at 127.0.0.1:{port}/0 is unreachable: connection refused. "
        "Start it or fix REDIS_URL."
    ) in result.stderr
    assert "Traceback" not in result.stderr
    assert PASSWORD not in result.stdout + result.stderr


def test_embedded_defaults_pass(run_manage, tmp_path: Path) -> None:
    result = run_manage("check_services", env={"DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"SQLite at {tmp_path}/db.sqlite3: ok",
        "Redis: not configured (REDIS_URL unset: in-memory channel layer, eager Celery, "
        "local-memory cache)",
    ]


def test_malformed_url_is_one_clear_line(run_manage) -> None:
    result = run_manage(
        "check_services", env={"DATABASE_URL": f"postgres://app:{PASSWORD}@db:notaport/market"}
    )
    assert result.returncode != 0
    assert result.stderr.strip() == (
        "Configuration error: DATABASE_URL has a port that is not a number between 1 and 65535"
    )


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.django_db
def test_live_services_pass(settings) -> None:
    out = StringIO()
    call_command("check_services", stdout=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("PostgreSQL at ") and lines[0].endswith(": ok")
    assert lines[1].startswith("Redis at ") and lines[1].endswith(": ok")
