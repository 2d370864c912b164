"""What the ledger's statements share: the server-bound, prepared cursor they run on, their
parameters' types, the windows they read and the SQL fragments for counter rows and window spend.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from django.db import DEFAULT_DB_ALIAS, connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models import Model

from accounts import rules
from accounts.algebra import SQL
from accounts.models.budgets import WINDOWED_PERIODS
from accounts.windows import window_for

M = TypeVar("M", bound=Model)
R = TypeVar("R")


def model_loaded(model: type[M], values: dict[str, Any]) -> M:
    """An instance of ``model`` for a row a statement here wrote, from the values it wrote
    (by attribute name; fields not given are deferred), without reading it back."""
    names = [f.attname for f in model._meta.concrete_fields if f.attname in values]
    return model.from_db(DEFAULT_DB_ALIAS, names, [values[name] for name in names])


# Each statement's parameters, cast to their columns' types: the statements are bound on the
# server (:func:`prepared_cursor`), where PostgreSQL could not always infer a parameter's type.
PARAM_TYPES = {
    "tenant": "bigint",
    "key": "bigint",
    "market": "bigint",
    "request_id": "varchar",
    "request_class": "varchar",
    "bid_source": "varchar",
    "gateway": "varchar",
    "round_id": "varchar",
    "amount": "numeric",
    "bid": "numeric",
    "priority_cap": "numeric",
    "price_input": "numeric",
    "price_cached": "numeric",
    "price_output": "numeric",
    "tokens": "numeric",
    "priority": "numeric",
    "tokens_detail": "jsonb",
    "priority_detail": "jsonb",
    "now": "timestamptz",
    "day": "timestamptz",
    "week": "timestamptz",
    "month": "timestamptz",
    "day_end": "timestamptz",
    "week_end": "timestamptz",
    "month_end": "timestamptz",
    "prompt_tokens": "integer",
    "cached_tokens": "integer",
    "completion_tokens": "integer",
    "ttft_s": "double precision",
    "e2e_s": "double precision",
    "fail": "boolean",
    # A batch's requests, one array element each, in arrival order.
    "request_ids": "varchar[]",
    "tokens_asked": "numeric[]",
    "priorities": "numeric[]",
    "round_ids": "varchar[]",
    "tokens_details": "jsonb[]",
    "priority_details": "jsonb[]",
    "prices_input": "numeric[]",
    "prices_cached": "numeric[]",
    "prices_output": "numeric[]",
    "prompt_tokens_each": "integer[]",
    "cached_tokens_each": "integer[]",
    "completion_tokens_each": "integer[]",
    "ttft_s_each": "double precision[]",
    "e2e_s_each": "double precision[]",
    "summed": "boolean",
    # A batch of holds, one array element each, in arrival order.
    "tenants": "bigint[]",
    "keys": "bigint[]",
    "amounts": "numeric[]",
    "with_requests": "boolean[]",
    "markets": "bigint[]",
    "bids": "numeric[]",
    "priority_caps": "numeric[]",
    "request_classes": "varchar[]",
    "bid_sources": "varchar[]",
    "gateways": "varchar[]",
}


_NAMED = re.compile(r"%\((\w+)\)s")  # a named parameter, %(name)s


def typed(sql: str) -> str:
    """``sql`` with every ``%(name)s`` parameter cast to its type (PARAM_TYPES)."""
    return _NAMED.sub(lambda m: f"{m.group(0)}::{PARAM_TYPES[m.group(1)]}", sql)


@functools.lru_cache(maxsize=64)
def numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with its ``%(name)s`` parameters as PostgreSQL's own ``$1, $2, ...`` (one number
    per name, in order of first use), and the names in that order."""
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${names.setdefault(match.group(1), len(names) + 1)}"

    return _NAMED.sub(number, sql), tuple(names)


@functools.cache
def _prepared_cursor_class() -> type:
    import psycopg  # noqa: PLC0415
    from django.db.backends.postgresql.base import CursorMixin  # noqa: PLC0415

    class PreparedCursor(CursorMixin, psycopg.RawCursor):
        """A server-bound cursor preparing every statement it runs, with the statements'
        named parameters turned into PostgreSQL's numbered ones once per statement
        (:func:`numbered`). psycopg's raw cursor sends the text as it is: a cursor with named
        parameters parses the text at every execution unless it is at most 4096 bytes, and the
        charge statement is over 5,000 (that parse was ~0.3 ms of CPU per charge)."""

        def execute(self, query, params=None, **kwargs):  # type: ignore[no-untyped-def]
            raw, names = numbered(query)
            return super().execute(raw, [params[name] for name in names], prepare=True)

    return PreparedCursor


@dataclass(frozen=True)
class Statement(Generic[R]):
    """One of the ledger's statements, ready to run on any connection to the database:
    ``sql`` with named parameters (``%(name)s``, or PostgreSQL's own numbering by
    :func:`numbered`), their values ``params``, and ``read``, what the statement's rows say.
    :meth:`run` runs it on Django's connection; the gateway runs the same on its event loop."""

    sql: str
    params: dict[str, Any]
    read: Callable[[list[tuple[Any, ...]]], R]

    def run(self) -> R:
        """Run on Django's connection (:func:`prepared_cursor`), in the caller's transaction."""
        with prepared_cursor() as cursor:
            cursor.execute(self.sql, self.params)
            return self.read(cursor.fetchall())


# psycopg's prepare threshold that lets a statement be prepared only when it asks to be
# (``prepare=True``): psycopg prepares nothing on a connection whose threshold is None.
PREPARE_WHEN_ASKED = 2**31 - 1
# PostgreSQL plans each prepared statement once, for any parameters (:func:`generic_plans`).
GENERIC_PLANS_SQL = "SET plan_cache_mode = force_generic_plan"


def prepared_cursor() -> CursorWrapper:
    """A cursor on Django's connection whose statements are bound on the server and prepared
    once per connection: PostgreSQL parses and plans each statement here once, not at every
    call (Django's own cursors bind on the client, which cannot be prepared)."""
    connection.ensure_connection()
    connection.validate_thread_sharing()
    if connection.connection.prepare_threshold is None:
        # Django switches psycopg's prepared statements off (None); its own cursors bind on the
        # client and never prepare anyway, so turning them on affects only the cursors made
        # here, which ask for it (prepare=True) whatever the threshold.
        connection.connection.prepare_threshold = PREPARE_WHEN_ASKED
    cursor = _prepared_cursor_class()(connection.connection)
    if connection.queries_logged:
        return connection.make_debug_cursor(cursor)
    return connection.make_cursor(cursor)


def generic_plans(*, connection: BaseDatabaseWrapper, **_: Any) -> None:
    """Have PostgreSQL plan each statement prepared on a new connection once, for any
    parameters (``plan_cache_mode``), not again at every execution. Its default plans a
    prepared statement anew for each call's parameters while it thinks that could pay: for the
    ledger's statements, whose plans only the batch's length could change, that planning was
    about a quarter of PostgreSQL's CPU for a small batch. Only the statements of
    :func:`prepared_cursor` are prepared (Django binds on the client), so only they are
    affected. Connected to Django's ``connection_created`` (``accounts.apps``)."""
    with connection.cursor() as cursor:
        cursor.execute(GENERIC_PLANS_SQL)


def windows(now: datetime) -> dict[str, datetime | None]:
    """Each windowed period's window at ``now``: its start (``day``, ...: the counters'
    ``*_start``) and its end (``day_end``, ...)."""
    params: dict[str, datetime | None] = {}
    for p in WINDOWED_PERIODS:
        window = window_for(period=p, now=now)
        params[p], params[f"{p}_end"] = window.start, window.end
    return params


# How many counter rows a request of (tenant, key) needs: the tenant's, and the key's if any.
COUNTERS_NEEDED = "CASE WHEN {key} IS NULL THEN 1 ELSE 2 END"
COUNTERS_FOUND = """(SELECT count(*) FROM accounts_budgetcounter c
      WHERE c.tenant_id = {tenant} AND (c.api_key_id IS NULL OR c.api_key_id = {key}))"""


def window_bound(period: str, bound: str = "") -> str:
    """The start (``bound`` "") or the end (``bound`` "_end") of the window at the statement's
    time of the windowed period in column ``period`` (a parameter per period, :func:`windows`)."""
    whens = " ".join(f"WHEN '{p}' THEN %({p}{bound})s" for p in WINDOWED_PERIODS)
    return f"CASE {period} {whens} END"


def _by_period(rule: Callable[..., str]) -> str:
    """A budget ``b``'s spend in its window at the statement's time from its counter row ``c``:
    ``rule`` (``rules.window_spent`` or ``rules.window_spent_at_most``) over the row's columns of
    the budget's period and the window's start (a parameter per period, :func:`windows`); the
    total for a budget of no period."""
    whens = " ".join(
        f"WHEN '{p}' THEN "
        + rule(SQL, kept_start=f"c.{p}_start", kept_spent=f"c.{p}_spent", start=f"%({p})s")
        for p in WINDOWED_PERIODS
    )
    return f"CASE b.period WHEN 'none' THEN c.spent_total {whens} END"


# The spend of a budget's window (``rules.window_spent``): NULL when that window is older than
# the row's (a writer's clock behind the row's): LEDGER_SPENT then.
WINDOW_SPENT = _by_period(rules.window_spent)
# The spend of a budget's window read for what it has left (``rules.window_spent_at_most``).
WINDOW_SPENT_AT_MOST = _by_period(rules.window_spent_at_most)
# The spend of a budget ``b``'s window at the statement's time, summed from the ledger. Read only
# with the counter rows locked by an earlier statement of the transaction: this statement's
# snapshot (READ COMMITTED: its own) then holds every entry counted in them, and no other can be
# written meanwhile.
LEDGER_SPENT = f"""(SELECT COALESCE(sum(e.amount), 0) FROM accounts_ledgerentry e
      WHERE e.tenant_id = b.tenant_id AND (b.api_key_id IS NULL OR e.api_key_id = b.api_key_id)
        AND e.created_at >= {window_bound("b.period")}
        AND e.created_at < {window_bound("b.period", "_end")})"""


def window_counted(row: str, *, start: str, spent: str, window: str, amount: str) -> str:
    """The SET clause counting ``amount`` in a row's window columns (``rules.window_counted``)
    for the window starting at ``window``."""
    kept = {"kept_start": f"{row}.{start}", "kept_spent": f"{row}.{spent}"}
    new_start, new_spent = rules.window_counted(SQL, **kept, start=window, amount=amount)
    return f"{spent} = {new_spent}, {start} = {new_start}"
