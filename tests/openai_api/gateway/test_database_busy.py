"""A database that stays locked past its timeout is a 503 with Retry-After, not a 500.

``db.database_busy`` tells a lock timeout (PostgreSQL's lock timeout, deadlock and
serialization failure) from a broken database; the gateway's database
steps turn the first kind into ``DatabaseBusy``."""

from __future__ import annotations

import httpx
import psycopg.errors
import pytest
from django.db import IntegrityError, InterfaceError, OperationalError

from accounts.models import Hold, HoldState, LedgerEntry
from openai_api.gateway import admission
from openai_api.gateway.db import database_busy, database_unreachable
from tests.openai_api.helpers import HELLO, lock_timeout


def _wrapped(cause: Exception, message: str) -> OperationalError:
    """What Django raises for a driver's error: its own class, the driver's as the cause."""
    try:
        raise OperationalError(message) from cause
    except OperationalError as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "busy"),
    [
        # No PostgreSQL SQLSTATE behind it: not told busy by its words alone.
        (OperationalError("database is locked"), False),
        (_wrapped(psycopg.errors.LockNotAvailable("lock timeout"), "lock timeout"), True),
        (_wrapped(psycopg.errors.DeadlockDetected("deadlock detected"), "deadlock"), True),
        (_wrapped(psycopg.errors.SerializationFailure("could not serialize"), "serialize"), True),
        (OperationalError("no such table: accounts_hold"), False),
        (OperationalError("unable to open database file"), False),
        (_wrapped(psycopg.errors.AdminShutdown("terminating connection"), "shutdown"), False),
        # The driver's own, as the event loop's connection raises them (``db.statement_run``).
        (psycopg.errors.LockNotAvailable("lock timeout"), True),
        (psycopg.errors.DeadlockDetected("deadlock detected"), True),
        (psycopg.errors.AdminShutdown("terminating connection"), False),
        (psycopg.OperationalError("connection refused"), False),
        (IntegrityError("UNIQUE constraint failed"), False),
        (ValueError("database is locked"), False),
    ],
)
def test_lock_timeouts_are_told_from_broken_databases(exc: Exception, busy: bool) -> None:
    assert database_busy(exc) is busy


@pytest.mark.parametrize(
    ("exc", "unreachable"),
    [
        # The server went away or was never there: no SQLSTATE (the driver's own error), class
        # 08, or a shutdown; Django's wrapping of them and the driver's own alike.
        (_wrapped(psycopg.OperationalError("connection refused"), "refused"), True),
        (psycopg.OperationalError("connection refused"), True),
        (_wrapped(psycopg.errors.AdminShutdown("terminating connection"), "shutdown"), True),
        (psycopg.errors.AdminShutdown("terminating connection"), True),
        (psycopg.errors.CannotConnectNow("the database system is starting up"), True),
        (psycopg.InterfaceError("the connection is closed"), True),
        (InterfaceError("connection already closed"), True),
        # A statement that failed on a server that is there.
        (psycopg.errors.LockNotAvailable("lock timeout"), False),
        (_wrapped(psycopg.errors.LockNotAvailable("lock timeout"), "lock timeout"), False),
        (OperationalError("disk I/O error"), False),
        (ValueError("connection refused"), False),
    ],
)
def test_a_database_away_is_told_from_a_statement_that_failed(
    exc: Exception, unreachable: bool
) -> None:
    assert database_unreachable(exc) is unreachable


def _chat(gateway, acme, market) -> httpx.Response:
    with acme.http(gateway) as http:
        return http.post(
            "/v1/chat/completions",
            json={"model": market.served_model, "messages": HELLO, "max_tokens": 2, "bid": "0.1"},
        )


def test_a_locked_database_is_a_503_with_retry_after(gateway, acme, market, monkeypatch):
    def admit_locked(**kwargs):
        raise lock_timeout()

    monkeypatch.setattr(admission, "request_admit", admit_locked)
    response = _chat(gateway, acme, market)
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == "1"
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("server_busy", "database_busy", None)
    assert "retry after 1 s" in error["message"]
    assert not LedgerEntry.objects.exists()
    assert not Hold.objects.filter(state=HoldState.OPEN).exists()


def test_a_broken_database_is_still_a_500(gateway, acme, market, monkeypatch):
    def admit_broken(**kwargs):
        raise OperationalError("disk I/O error")

    monkeypatch.setattr(admission, "request_admit", admit_broken)
    response = _chat(gateway, acme, market)
    assert response.status_code == 500, response.text
    assert "Retry-After" not in response.headers
    assert response.json()["error"]["code"] == "internal_error"
