"""SQLite set up for several writers at once (``config.backends.database_concurrent``).

The race of the embedded mode, made deterministic: two transactions that each read and then
write (a hold, a settlement) overlap. With SQLite's deferred transactions one of them fails at
once with "database is locked", whatever the busy timeout; with the project's options the second
waits for the first at BEGIN and both commit. The connections are opened by Django's SQLite
backend itself, from the DATABASES entry, as the running project opens them.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from django.db import connections
from django.db.backends.sqlite3.base import DatabaseWrapper

from config import backends


def _entry(path: Path, *, tuned: bool) -> dict:
    entry = backends.sqlite_database(path)
    return backends.database_concurrent(entry) if tuned else entry


def _connect(entry: dict) -> tuple[sqlite3.Connection, str]:
    """A raw connection as Django's backend opens it (init commands, timeout), in autocommit
    mode as Django keeps it, and the BEGIN its atomic() would send."""
    settings_dict = connections.configure_settings({"default": entry})["default"]
    wrapper = DatabaseWrapper(settings_dict, alias="probe")
    conn = wrapper.get_new_connection(wrapper.get_connection_params())
    conn.isolation_level = None
    return conn, f"BEGIN {wrapper.transaction_mode or ''}".strip()


def _overlapping_read_then_write(path: Path, *, tuned: bool) -> list[str]:
    """Two threads, each: BEGIN; read the counter; write it + 1; COMMIT. The second reads
    while the first's transaction is open (when SQLite lets it). Returns each one's outcome."""
    setup, _ = _connect(_entry(path, tuned=tuned))
    setup.execute("CREATE TABLE counter (n INTEGER)")
    setup.execute("INSERT INTO counter VALUES (0)")
    setup.close()
    first_read, second_read = threading.Event(), threading.Event()
    outcomes: dict[str, str] = {}

    def transaction(name: str) -> None:
        conn, begin = _connect(_entry(path, tuned=tuned))
        try:
            if name == "second":
                first_read.wait(5)
            conn.execute(begin)
            (n,) = conn.execute("SELECT n FROM counter").fetchone()
            if name == "first":
                first_read.set()
                # Let the second read too, if its BEGIN lets it: with IMMEDIATE it is waiting
                # for this transaction, and never reads before this one commits.
                second_read.wait(1.0)
            else:
                second_read.set()
            conn.execute("UPDATE counter SET n = ?", (n + 1,))
            conn.execute("COMMIT")
            outcomes[name] = "committed"
        except sqlite3.OperationalError as exc:
            outcomes[name] = str(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=transaction, args=(n,)) for n in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    check, _ = _connect(_entry(path, tuned=tuned))
    (n,) = check.execute("SELECT n FROM counter").fetchone()
    check.close()
    return [outcomes["first"], outcomes["second"], f"n={n}"]


def test_overlapping_writers_both_commit_with_the_projects_options(tmp_path):
    assert _overlapping_read_then_write(tmp_path / "db.sqlite3", tuned=True) == [
        "committed",
        "committed",
        "n=2",
    ]


def test_with_sqlites_defaults_one_of_them_fails_at_once(tmp_path):
    """The control: what the embedded mode did before (so the test above can fail)."""
    outcomes = _overlapping_read_then_write(tmp_path / "db.sqlite3", tuned=False)
    assert "database is locked" in outcomes and outcomes[-1] == "n=1", outcomes


def test_the_options_apply_to_sqlite_only_and_keep_explicit_ones() -> None:
    sqlite = backends.database_concurrent(backends.sqlite_database("/tmp/x.db"))
    assert sqlite["OPTIONS"] == {
        "transaction_mode": "IMMEDIATE",
        "timeout": backends.SQLITE_TIMEOUT_S,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
    }
    mine = backends.database_concurrent(
        {**backends.sqlite_database("/tmp/x.db"), "OPTIONS": {"timeout": 1}}
    )
    assert mine["OPTIONS"]["timeout"] == 1 and mine["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    postgres = backends.parse_database_url("postgres://u@db:5432/market", base_dir=Path("/"))
    assert backends.database_concurrent(postgres) == postgres


def test_a_file_database_is_in_wal_mode(tmp_path) -> None:
    conn, _ = _connect(_entry(tmp_path / "db.sqlite3", tuned=True))
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
    finally:
        conn.close()


@pytest.mark.parametrize("tuned", [True, False])
def test_the_probe_connections_are_django_sqlite_ones(tmp_path, tuned) -> None:
    _, begin = _connect(_entry(tmp_path / "db.sqlite3", tuned=tuned))
    assert begin == ("BEGIN IMMEDIATE" if tuned else "BEGIN")
