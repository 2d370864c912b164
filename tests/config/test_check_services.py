"""``manage.py check_services``: a line per service; a clear message and exit 1 for a dead one."""

from io import StringIO

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


def test_dead_redis_gives_a_clear_message(run_manage) -> None:
    port = dead_port()
    result = run_manage(
        "check_services", env={"REDIS_URL": f"redis://:{PASSWORD}@127.0.0.1:{port}/0"}
    )
    assert result.returncode == 1
    assert result.stdout.startswith("PostgreSQL at ") and ": ok" in result.stdout
    assert (
        f"Redis at 127.0.0.1:{port}/0 is unreachable: connection refused. "
        "Start it or fix REDIS_URL."
    ) in result.stderr
    assert "Traceback" not in result.stderr
    assert PASSWORD not in result.stdout + result.stderr


@pytest.mark.parametrize("variable", ["DATABASE_URL", "REDIS_URL"])
def test_an_unset_service_is_one_line_saying_how_to_get_one(run_manage, variable) -> None:
    result = run_manage("check_services", unset=(variable,))
    assert result.returncode != 0
    assert result.stderr.strip() == (
        f"Configuration error: {variable} is not set. `make run` and `make test` start the "
        "checkout's own PostgreSQL and Redis when it is unset; for another command, run it "
        "through them with `python -m config.local_services -- COMMAND`, or set it to your "
        "own service"
    )


def test_malformed_url_is_one_clear_line(run_manage) -> None:
    result = run_manage(
        "check_services", env={"DATABASE_URL": f"postgres://app:{PASSWORD}@db:notaport/market"}
    )
    assert result.returncode != 0
    assert result.stderr.strip() == (
        "Configuration error: DATABASE_URL has a port that is not a number between 1 and 65535"
    )


@pytest.mark.django_db
def test_live_services_pass(settings) -> None:
    out = StringIO()
    call_command("check_services", stdout=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("PostgreSQL at ") and lines[0].endswith(": ok")
    assert lines[1].startswith("Redis at ") and lines[1].endswith(": ok")
