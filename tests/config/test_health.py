"""Reachability checks and /healthz: 200 with the services up, 503 when one is down."""

from importlib import metadata

import pytest
from django.db.utils import ConnectionHandler

from config import backends, health
from config.health import ServiceStatus, database_status, failure_reason, redis_status
from tests.conftest import dead_port

PASSWORD = "s3cretPassw0rd"


@pytest.fixture
def dead_database() -> ConnectionHandler:
    """Django connections whose default database is PostgreSQL on a port nothing listens on."""
    port = dead_port()
    url = f"postgres://app:{PASSWORD}@127.0.0.1:{port}/market"
    return ConnectionHandler({"default": backends.parse_database_url(url)})


# --- checks -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_database_status_ok() -> None:
    status = database_status()
    assert status.state == "ok"
    assert status.describe().endswith(": ok")


@pytest.mark.django_db
def test_database_status_reports_a_dead_postgres(dead_database: ConnectionHandler) -> None:
    connection = dead_database["default"]
    status = database_status(connection)
    port = connection.settings_dict["PORT"]
    assert (status.service, status.state, status.reason) == (
        "PostgreSQL",
        "error",
        "connection refused",
    )
    assert status.describe() == (
        f"PostgreSQL at 127.0.0.1:{port}/market is unreachable: connection refused. "
        "Start it or fix DATABASE_URL."
    )
    assert PASSWORD not in status.describe()


def test_redis_status_reports_a_dead_redis() -> None:
    port = dead_port()
    status = redis_status(f"redis://:{PASSWORD}@127.0.0.1:{port}/0")
    assert (status.service, status.state, status.reason) == ("Redis", "error", "connection refused")
    assert status.describe() == (
        f"Redis at 127.0.0.1:{port}/0 is unreachable: connection refused. "
        "Start it or fix REDIS_URL."
    )


def test_redis_status_ok(settings) -> None:
    status = redis_status(settings.REDIS_URL)
    assert status.state == "ok"
    assert (
        status.describe() == f"Redis at {backends.parse_redis_url(settings.REDIS_URL).display}: ok"
    )


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (
            'connection failed: connection to server at "127.0.0.1", port 5433 failed: '
            "Connection refused\n\tIs the server running on that host and accepting TCP/IP "
            "connections?",
            "connection refused",
        ),
        (
            'connection failed: connection to server at "10.0.0.9", port 5432 failed: '
            "timeout expired",
            "timed out",
        ),
        (
            'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  '
            'database "nope" does not exist',
            'database "nope" does not exist',
        ),
        (
            'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  '
            'password authentication failed for user "app"',
            "authentication failed",
        ),
        (
            "failed to resolve host 'db.internal': [Errno -2] Name or service not known",
            "host not found",
        ),
        ("Error 111 connecting to 127.0.0.1:6390. Connection refused.", "connection refused"),
        ("Timeout connecting to server", "timed out"),
        ("something else entirely.\nmore", "something else entirely"),
    ],
)
def test_failure_reason(message: str, reason: str) -> None:
    assert failure_reason(RuntimeError(message)) == reason


def test_a_failure_that_is_not_a_connection_problem_says_check() -> None:
    status = ServiceStatus(
        "PostgreSQL", "DATABASE_URL", "db:5432/x", "error", "authentication failed"
    )
    assert status.describe() == (
        "PostgreSQL at db:5432/x failed: authentication failed. Check DATABASE_URL."
    )


# --- /healthz -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_healthz_ok(client, settings) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.json() == {
        "status": "ok",
        "database": "ok",
        "redis": "ok",
        "version": metadata.version("inference-market"),
    }


@pytest.mark.django_db
def test_healthz_503_when_the_database_is_down(client, monkeypatch, dead_database) -> None:
    monkeypatch.setattr(health, "connections", dead_database)
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert (body["status"], body["database"]) == ("error", "error")
    assert PASSWORD not in response.content.decode()


@pytest.mark.django_db
def test_healthz_503_when_redis_is_down(client, settings) -> None:
    settings.REDIS_URL = f"redis://127.0.0.1:{dead_port()}/0"
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["status"] == "error"
    assert response.json()["redis"] == "error"
    assert response.json()["database"] == "ok"


@pytest.mark.django_db
def test_healthz_is_get_only(client) -> None:
    assert client.post("/healthz").status_code == 405
