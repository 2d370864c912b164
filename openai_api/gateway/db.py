"""Database work of the gateway, off the event loop, on a few threads that keep their connections.

Django's ORM is synchronous. Under ASGI, ``sync_to_async`` runs it in a thread of the request's
own, so each request would open (and close) a PostgreSQL connection: a few milliseconds, more
than the rest of the gateway's work. The gateway's few database steps per request (admit: key,
market, bid, hold; settle: the token charge or the release) run instead on a small pool of
threads (``GATEWAY_DB_THREADS``, default 2) whose connections stay open. A thread whose
connection failed closes it, and the next step there reconnects.

Work handed to a thread always finishes, even when the request that waited for it is cancelled
(the client went away): callers that must clean up after it use :func:`detached`. When the
server stops, :func:`drained` waits for those tasks (and the requests still unwinding) before the
process exits.

A step that waited out a lock (:func:`database_busy`) raises ``errors.DatabaseBusy``, a 503
with ``Retry-After``, rather than a 500: the database is busy, not broken. A step that could not
reach the database (:func:`database_unreachable`: it is stopped, restarting, or the connection
was cut) raises ``errors.DatabaseUnavailable``, a 503 with ``Retry-After`` too. Steps that may be
repeated (settling a request, releasing its hold: both idempotent) are tried again meanwhile by
:func:`db_call_retried`, so that an outage of a few seconds costs a wait, not an answer.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import weakref
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
from django.conf import settings
from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    InterfaceError,
    OperationalError,
    connections,
)

from accounts.ledger import Statement
from accounts.ledger.statements.sql import GENERIC_PLANS_SQL, PREPARE_WHEN_ASKED, numbered
from openai_api.gateway.errors import DatabaseBusy, DatabaseUnavailable

T = TypeVar("T")
BUSY_RETRY_AFTER_S = 1  # the Retry-After of a DatabaseBusy answer, seconds
# PostgreSQL's SQLSTATEs for a lock that was not granted in time, a deadlock, and a
# serialization failure (each rolls the transaction back).
POSTGRES_BUSY_SQLSTATES = frozenset({"55P03", "40P01", "40001"})
# PostgreSQL's SQLSTATEs of a server going away: shut down by an administrator, after a crash,
# or not accepting connections yet (starting, recovering); class 08 is a connection exception.
POSTGRES_GONE_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
UNAVAILABLE_RETRY_AFTER_S = 2  # the Retry-After of a DatabaseUnavailable answer, seconds
# db_call_retried: how long a repeatable step is tried again while the database cannot be
# reached (a restart takes a few seconds), and the delays between tries.
OUTAGE_RETRY_S = 30.0
OUTAGE_DELAYS_S = (0.1, 0.25, 0.5, 1.0, 2.0)

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_threads = 0
_background: set[asyncio.Task[Any]] = set()
_requests: set[asyncio.Task[Any]] = set()
# Each event loop's own connections, by lane (``statement_run``); those of a closed loop are
# closed when another connects (``_closed_loops_forgotten``) or by ``connections_close``.
_loop_connections: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[str, psycopg.AsyncConnection]
] = weakref.WeakKeyDictionary()


def threads_configured() -> int:
    """The ``GATEWAY_DB_THREADS`` setting."""
    threads = settings.GATEWAY_DB_THREADS
    if threads < 1:
        raise ValueError(f"GATEWAY_DB_THREADS must be >= 1, got {threads}")
    return threads


def _pool() -> ThreadPoolExecutor:
    global _executor, _threads
    if _executor is not None:  # set once: no lock taken per call
        return _executor
    with _lock:
        if _executor is None:
            _threads = threads_configured()
            _executor = ThreadPoolExecutor(max_workers=_threads, thread_name_prefix="gateway-db")
        return _executor


def _driver_error(exc: BaseException) -> BaseException | None:
    """The driver's error behind ``exc``: psycopg's own, or the one Django's error wraps."""
    if isinstance(exc, psycopg.Error):
        return exc
    if isinstance(exc, DatabaseError) and isinstance(exc.__cause__, psycopg.Error):
        return exc.__cause__
    return None


def database_busy(exc: BaseException) -> bool:
    """Whether ``exc`` says the database was too busy (a lock not had in time), not broken."""
    driver = _driver_error(exc)
    return driver is not None and getattr(driver, "sqlstate", None) in POSTGRES_BUSY_SQLSTATES


def database_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be reached or went away (PostgreSQL), as
    opposed to a statement that failed."""
    if isinstance(exc, InterfaceError | psycopg.InterfaceError):  # the connection was closed
        return True
    driver = _driver_error(exc)
    if not isinstance(driver, psycopg.OperationalError):
        return False  # not the driver's: nothing says the server is away
    sqlstate = driver.sqlstate
    # No SQLSTATE: the driver's own error (connection refused, reset, closed).
    return sqlstate is None or sqlstate.startswith("08") or sqlstate in POSTGRES_GONE_SQLSTATES


def _refusal_of(exc: Exception) -> Exception:
    """The gateway's error for a database error: DatabaseBusy, DatabaseUnavailable, or ``exc``."""
    if database_busy(exc):
        return DatabaseBusy.retrying("the database is busy", BUSY_RETRY_AFTER_S)
    if database_unreachable(exc):
        what = "the database cannot be reached"
        return DatabaseUnavailable.retrying(what, UNAVAILABLE_RETRY_AFTER_S)
    return exc


def _run(fn: Callable[..., T], kwargs: dict[str, Any]) -> T:
    try:
        return fn(**kwargs)
    except (OperationalError, InterfaceError) as exc:
        # The connection may be broken (server restart, network): drop it, reconnect next time.
        for conn in connections.all(initialized_only=True):
            if conn.connection is not None and not conn.in_atomic_block:
                conn.close()
        refusal = _refusal_of(exc)
        if refusal is exc:
            raise
        raise refusal from exc


async def db_call(fn: Callable[..., T], /, **kwargs: Any) -> T:
    """Run ``fn(**kwargs)`` on a gateway database thread and return its result."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    return await loop.run_in_executor(_pool(), functools.partial(context.run, _run, fn, kwargs))


async def statement_run(statement: Statement[T], /, *, lane: str) -> T:
    """Run one of the ledger's statements on this event loop's own connection for ``lane``
    (one per kind of write, so that a statement waiting for a lock holds up only its kind), in
    a transaction of its own, and read its rows: psycopg's async driver, with no thread hop
    (a hop to a database thread and back costs about as much CPU as the statement's own round
    trip). The statement is bound on the server and prepared once per connection, as
    ``prepared_cursor`` does on Django's. DatabaseBusy and DatabaseUnavailable as
    :func:`db_call` raises them; a connection that failed is closed, the next statement
    connects again."""
    loop = asyncio.get_running_loop()
    mine = _loop_connections.setdefault(loop, {})
    raw, names = numbered(statement.sql)
    try:
        conn = mine.get(lane)
        if conn is None or conn.closed:
            _closed_loops_forgotten()
            conn = await _connected()
            if (other := mine.get(lane)) is not None and not other.closed:
                await conn.close()  # another statement of the lane connected meanwhile
                conn = other
            mine[lane] = conn
        async with psycopg.AsyncRawCursor(conn) as cursor:
            await cursor.execute(raw, [statement.params[n] for n in names], prepare=True)
            rows = await cursor.fetchall()
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        broken = mine.pop(lane, None)
        if broken is not None:
            await broken.close()
        refusal = _refusal_of(exc)
        if refusal is exc:
            raise
        raise refusal from exc
    return statement.read(rows)


def _closed_loops_forgotten() -> None:
    """Close the connections of event loops that are closed (a test's, or a thread's that
    ended): a connection keeps its loop alive, so the weak map would not drop them itself."""
    for loop in [loop for loop in _loop_connections if loop.is_closed()]:
        for conn in _loop_connections.pop(loop).values():
            conn.pgconn.finish()


async def _connected() -> psycopg.AsyncConnection:
    """A new connection to Django's database, set up as Django sets up its own (parameters,
    types, time zone) and as the ledger's statements need (``generic_plans``)."""
    django_connection = connections[DEFAULT_DB_ALIAS]
    params = django_connection.get_connection_params()
    params.pop("cursor_factory", None)  # Django's, for its synchronous connections
    params["prepare_threshold"] = PREPARE_WHEN_ASKED  # prepared when asked (prepare=True)
    conn = await psycopg.AsyncConnection.connect(**params, autocommit=True)
    await conn.execute(GENERIC_PLANS_SQL)
    if django_connection.timezone_name:
        await conn.execute(
            django_connection.ops.set_time_zone_sql(), [django_connection.timezone_name]
        )
    return conn


async def db_call_retried(
    fn: Callable[..., T], /, *, within_s: float = OUTAGE_RETRY_S, **kwargs: Any
) -> T:
    """:func:`db_call` for a step that may be repeated (an idempotent one): while the database
    cannot be reached it is tried again (:func:`retried`)."""
    return await retried(functools.partial(db_call, fn, **kwargs), within_s=within_s)


async def retried(
    step: Callable[[], Coroutine[Any, Any, T]], /, *, within_s: float = OUTAGE_RETRY_S
) -> T:
    """Await ``step()``, a database step that may be repeated (an idempotent one): while the
    database cannot be reached it is tried again, after :data:`OUTAGE_DELAYS_S` (then every
    2 s), for up to ``within_s`` seconds; then DatabaseUnavailable."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    tries = 0
    while True:
        try:
            return await step()
        except DatabaseUnavailable:
            delay = OUTAGE_DELAYS_S[min(tries, len(OUTAGE_DELAYS_S) - 1)]
            if loop.time() + delay > deadline:
                raise
            tries += 1
            await asyncio.sleep(delay)


def detached(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Run ``coro`` as a task that a cancelled caller does not cancel (a reference is kept
    until it ends). Await it through ``asyncio.shield`` to wait for it when not cancelled."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


async def shielded(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` to the end even if the caller is cancelled meanwhile (then it re-raises
    the cancellation after ``coro`` finishes in the background)."""
    return await asyncio.shield(detached(coro))


def request_tracked(task: asyncio.Task[T]) -> asyncio.Task[T]:
    """Count ``task`` (a request being served) among what :func:`drained` waits for."""
    _requests.add(task)
    task.add_done_callback(_requests.discard)
    return task


async def drained(timeout_s: float) -> bool:
    """Wait, up to ``timeout_s`` seconds, until this loop has no request being served (those
    :func:`request_tracked`) and no detached task (the settlements and releases they started,
    and those these start in turn): whether all ended. The server's stop waits here after it
    cancelled the requests it would not wait for, so that their holds are released (or their
    answers settled) before the process exits."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        await asyncio.sleep(0)  # cancelled tasks take their cancellation, starting their releases
        pending = [t for t in (*_requests, *_background) if t.get_loop() is loop and not t.done()]
        if not pending:
            return True
        remaining = deadline - loop.time()
        if remaining <= 0:
            return False
        await asyncio.wait(pending, timeout=remaining)


async def background_drained(timeout_s: float = 10.0) -> None:
    """Wait for this loop's detached tasks (tests, shutdown)."""
    loop = asyncio.get_running_loop()
    mine = [t for t in _background if t.get_loop() is loop]
    if mine:
        await asyncio.wait(mine, timeout=timeout_s)


def connections_close() -> None:
    """Close every gateway thread's database connections, and the event loops' own (before a
    test database is dropped).

    Each thread runs one closing step; a barrier makes sure no thread takes two. A loop's
    connection is closed from any thread: the libpq connection is finished, which is all
    closing it sends.
    """
    for mine in list(_loop_connections.values()):
        for conn in list(mine.values()):
            conn.pgconn.finish()
        mine.clear()
    with _lock:
        executor, threads = _executor, _threads
    if executor is None:
        return
    barrier = threading.Barrier(threads)

    def close() -> None:
        try:
            barrier.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass  # fewer threads were ever started: they are all closed by now anyway
        connections.close_all()

    for future in [executor.submit(close) for _ in range(threads)]:
        future.result(timeout=10)
