"""The hot path's writes on PostgreSQL, one statement each: a hold, a charge, a release.

Each function here does in one SQL statement (so in one round trip, atomic without BEGIN and
COMMIT) what the reference ledger store (``accounts.ledger.orm``) does in a transaction; the
PostgreSQL store (``accounts.ledger.postgres``) runs them, and the reference instead in the few
cases a statement here declines (it then writes nothing and says so): the first
request of a tenant or key (no counter rows yet), a hold for a request id that already has one,
and a hold whose clock is behind the window its counters keep.

Locks, in the same order everywhere so that two statements never deadlock: the request's row,
then its hold's, then the counter rows of its tenant and of its key, in that order
(``ORDER BY api_key_id NULLS FIRST ... FOR UPDATE``). ``FOR UPDATE`` returns the newest committed
version of a row it waited for, so every check below reads values no one else can change before
the statement commits: concurrent holds cannot overspend a budget. The counters' window rule is
:meth:`accounts.models.BudgetCounter.charge_counted`'s.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connection
from django.db.backends.utils import CursorWrapper
from django.db.models import Model

from accounts.models.budgets import WINDOWED_PERIODS
from accounts.windows import window_for

M = TypeVar("M", bound=Model)


def model_loaded(model: type[M], values: dict[str, Any]) -> M:
    """An instance of ``model`` for a row a statement here wrote, from the values it wrote
    (by attribute name; fields not given are deferred), without reading it back."""
    names = [f.attname for f in model._meta.concrete_fields if f.attname in values]
    return model.from_db(DEFAULT_DB_ALIAS, names, [values[name] for name in names])


# Each statement's parameters, cast to their columns' types: the statements are bound on the
# server (:func:`_cursor`), where PostgreSQL could not always infer a parameter's type itself.
PARAM_TYPES = {
    "tenant": "bigint",
    "key": "bigint",
    "market": "bigint",
    "market_slug": "varchar",
    "request_id": "varchar",
    "request_class": "varchar",
    "bid_source": "varchar",
    "kind": "varchar",
    "round_id": "varchar",
    "amount": "numeric",
    "bid": "numeric",
    "priority_cap": "numeric",
    "price_input": "numeric",
    "price_cached": "numeric",
    "price_output": "numeric",
    "detail": "jsonb",
    "now": "timestamptz",
    "day": "timestamptz",
    "week": "timestamptz",
    "month": "timestamptz",
    "prompt_tokens": "integer",
    "cached_tokens": "integer",
    "completion_tokens": "integer",
    "ttft_s": "double precision",
    "e2e_s": "double precision",
    "fail": "boolean",
}


def _typed(sql: str) -> str:
    """``sql`` with every ``%(name)s`` parameter cast to its type (PARAM_TYPES)."""
    return re.sub(r"%\((\w+)\)s", lambda m: f"{m.group(0)}::{PARAM_TYPES[m.group(1)]}", sql)


@functools.cache
def _prepared_cursor_class() -> type:
    from django.db.backends.postgresql.base import ServerBindingCursor  # noqa: PLC0415

    class PreparedCursor(ServerBindingCursor):
        """psycopg's server-side binding cursor, preparing every statement it runs."""

        def execute(self, query, params=None, **kwargs):  # type: ignore[no-untyped-def]
            return super().execute(query, params, prepare=True)

    return PreparedCursor


def _cursor() -> CursorWrapper:
    """A cursor on Django's connection whose statements are bound on the server and prepared
    once per connection: PostgreSQL parses and plans each statement here once, not at every
    call (Django's own cursors bind on the client, which cannot be prepared)."""
    connection.ensure_connection()
    connection.validate_thread_sharing()
    if connection.connection.prepare_threshold is None:
        # Django switches psycopg's prepared statements off (None); its own cursors bind on the
        # client and never prepare anyway, so turning them on affects only the cursors made
        # here, which ask for it (prepare=True) whatever the threshold.
        connection.connection.prepare_threshold = 2**31 - 1
    cursor = _prepared_cursor_class()(connection.connection)
    if connection.queries_logged:
        return connection.make_debug_cursor(cursor)
    return connection.make_cursor(cursor)


def _windows(now: datetime) -> dict[str, datetime]:
    """The start of each windowed period's window at ``now``: the counters' ``*_start``."""
    return {p: window_for(period=p, now=now).start for p in WINDOWED_PERIODS}


# How many counter rows a request of (tenant, key) needs: the tenant's, and the key's if any.
_COUNTERS_NEEDED = "CASE WHEN {key} IS NULL THEN 1 ELSE 2 END"
_COUNTERS_FOUND = """(SELECT count(*) FROM accounts_budgetcounter c
      WHERE c.tenant_id = {tenant} AND (c.api_key_id IS NULL OR c.api_key_id = {key}))"""

# The spend of a budget's window at the statement's time, from its counter row ``c``: NULL when
# that window is older than the row's (then the reference code sums the ledger).
_WINDOW_SPENT = """CASE b.period
    WHEN 'none' THEN c.spent_total
    WHEN 'day' THEN CASE WHEN c.day_start = %(day)s THEN c.day_spent
                         WHEN c.day_start < %(day)s THEN 0 END
    WHEN 'week' THEN CASE WHEN c.week_start = %(week)s THEN c.week_spent
                          WHEN c.week_start < %(week)s THEN 0 END
    WHEN 'month' THEN CASE WHEN c.month_start = %(month)s THEN c.month_spent
                           WHEN c.month_start < %(month)s THEN 0 END
END"""

_HOLD_SQL = f"""
WITH counter AS (
    SELECT id, api_key_id, held, spent_total,
           day_start, day_spent, week_start, week_spent, month_start, month_spent
    FROM accounts_budgetcounter
    WHERE tenant_id = %(tenant)s AND (api_key_id IS NULL OR api_key_id = %(key)s)
    ORDER BY api_key_id NULLS FIRST
    FOR UPDATE
),
usage AS (
    SELECT b.id, b.api_key_id, b.period, b."limit", b.soft_alert_fraction, c.held,
           {_WINDOW_SPENT} AS spent
    FROM accounts_budget b JOIN counter c ON c.api_key_id IS NOT DISTINCT FROM b.api_key_id
    WHERE b.tenant_id = %(tenant)s AND (b.api_key_id IS NULL OR b.api_key_id = %(key)s)
),
verdict AS (
    SELECT (SELECT count(*) FROM counter) = {_COUNTERS_NEEDED.format(key="%(key)s")}
               AND NOT EXISTS (SELECT FROM usage WHERE spent IS NULL) AS counted,
           NOT EXISTS (SELECT FROM usage WHERE spent + held + %(amount)s > "limit") AS fits
),
placed AS (
    INSERT INTO accounts_hold
        (request_id, tenant_id, api_key_id, amount, remaining, state, created_at)
    SELECT %(request_id)s, %(tenant)s, %(key)s, %(amount)s, %(amount)s, 'open', %(now)s
    FROM verdict WHERE counted AND fits
    ON CONFLICT (request_id) DO NOTHING
    RETURNING id
),
held AS (
    UPDATE accounts_budgetcounter c SET held = c.held + %(amount)s
    FROM counter WHERE c.id = counter.id AND EXISTS (SELECT FROM placed)
){{request}}
SELECT v.counted, v.fits, (SELECT id FROM placed), {{request_inserted}},
       u.id, u.api_key_id, u.period, u."limit", u.soft_alert_fraction, u.spent, u.held
FROM verdict v LEFT JOIN usage u ON true
ORDER BY u.id
"""

_REQUEST_INSERT = """,
request AS (
    INSERT INTO accounts_request (request_id, tenant_id, api_key_id, market_id, bid,
                                  priority_cap, request_class, bid_source, status, created_at)
    SELECT %(request_id)s, %(tenant)s, %(key)s, %(market)s, %(bid)s,
           %(priority_cap)s, %(request_class)s, %(bid_source)s, 'queued', %(now)s
    WHERE EXISTS (SELECT FROM placed)
    ON CONFLICT (request_id) DO NOTHING
    RETURNING 1
)"""

HOLD_SQL = _typed(_HOLD_SQL.format(request="", request_inserted="NULL"))
HOLD_AND_REQUEST_SQL = _typed(
    _HOLD_SQL.format(request=_REQUEST_INSERT, request_inserted="(SELECT count(*) FROM request)")
)


@dataclass(frozen=True)
class BudgetRow:
    """One budget that applies to a hold, as the hold statement read it (dollars)."""

    budget_id: int
    api_key_id: int | None
    period: str
    limit: Decimal
    soft_alert_fraction: Decimal
    spent: Decimal  # in the window at the hold's time
    held: Decimal  # before this hold


@dataclass(frozen=True)
class HoldOutcome:
    """What the hold statement did: ``hold_id`` is set when it placed the hold. Else it wrote
    nothing: ``counted`` false, it declined; ``fits`` false, a budget refused (``budgets``:
    which); both true, the request already has a hold."""

    hold_id: int | None
    counted: bool
    fits: bool
    budgets: list[BudgetRow]
    request_created: bool  # with a request: its row was created with the hold


def hold_place(
    *,
    tenant_id: int,
    api_key_id: int | None,
    request_id: str,
    amount: Decimal,
    now: datetime,
    request: dict[str, Any] | None = None,
) -> HoldOutcome:
    """Hold ``amount`` dollars for ``request_id`` if every budget of the tenant and the key
    fits it, and (with ``request``: market, bid, priority_cap, request_class, bid_source)
    record the request.
    """
    params = {
        "tenant": tenant_id,
        "key": api_key_id,
        "request_id": request_id,
        "amount": amount,
        "now": now,
        **_windows(now),
        **(request or {}),
    }
    with _cursor() as cursor:
        cursor.execute(HOLD_AND_REQUEST_SQL if request else HOLD_SQL, params)
        rows = cursor.fetchall()
    counted, fits, hold_id, request_created = rows[0][:4]
    budgets = [BudgetRow(*row[4:]) for row in rows if row[4] is not None]
    return HoldOutcome(
        hold_id=hold_id,
        counted=counted,
        fits=fits,
        budgets=budgets,
        request_created=bool(request_created),
    )


# A budget's window spend for the charge rule (``accounts.ledger.rules``): as _WINDOW_SPENT, and
# when the statement's clock is behind the row's window, the row's newer window (the most that
# window can have spent; the reference code reads it the same way).
_ROOM_SPENT = f"""COALESCE({_WINDOW_SPENT}, CASE b.period WHEN 'day' THEN c.day_spent
    WHEN 'week' THEN c.week_spent WHEN 'month' THEN c.month_spent END)"""
# The start of the autobidder's window at the statement's time.
_AUTOBID_WINDOW = """CASE a.period WHEN 'day' THEN %(day)s WHEN 'week' THEN %(week)s
    WHEN 'month' THEN %(month)s END"""

_CHARGE_SQL = f"""
WITH request AS (
    SELECT r.request_id, r.tenant_id, r.api_key_id, r.market_id, r.status, r.priority_cap,
           r.bid_source, r.priority_pending,
           {_COUNTERS_FOUND.format(tenant="r.tenant_id", key="r.api_key_id")}
               = {_COUNTERS_NEEDED.format(key="r.api_key_id")} AS counted,
           {{priced}} AS priced
    FROM accounts_request r {{market_join}}
    WHERE r.request_id = %(request_id)s
    FOR UPDATE OF r
),
live AS (  -- the request, when this statement writes its entry
    SELECT * FROM request WHERE status <> 'failed' AND counted AND priced AND {{writes_when}}
),
hold AS (
    SELECT h.id, h.remaining FROM accounts_hold h
    WHERE h.request_id = %(request_id)s AND h.state = 'open' AND EXISTS (SELECT FROM live)
    FOR UPDATE
),
counter AS (
    SELECT c.id, c.api_key_id, c.held, c.spent_total, c.day_start, c.day_spent, c.week_start,
           c.week_spent, c.month_start, c.month_spent
    FROM accounts_budgetcounter c, live q
    WHERE c.tenant_id = q.tenant_id AND (c.api_key_id IS NULL OR c.api_key_id = q.api_key_id)
      AND (SELECT count(*) FROM hold) >= 0  -- the hold's lock first, then these
    ORDER BY c.api_key_id NULLS FIRST
    FOR UPDATE OF c
),
autobidder AS ({{autobidder}}),
room AS (
    SELECT min(b."limit" - {_ROOM_SPENT} - c.held) AS budget
    FROM accounts_budget b JOIN counter c ON c.api_key_id IS NOT DISTINCT FROM b.api_key_id
    WHERE b.tenant_id = (SELECT tenant_id FROM live)
      AND (b.api_key_id IS NULL OR b.api_key_id = (SELECT api_key_id FROM live))
),
limits AS (  -- charge_allowed's three caps (NULL: none); LEAST ignores NULLs
    SELECT {{cap}} AS cap,
           CASE WHEN room.budget IS NOT NULL
                THEN COALESCE((SELECT remaining FROM hold), 0) + GREATEST(room.budget, 0)
           END AS budget,
           (SELECT GREATEST(a.room, 0) FROM autobidder a) AS autobid
    FROM live, room
),
charge AS (
    SELECT LEAST(%(amount)s, cap, budget, autobid) AS amount, cap, budget FROM limits
),
capped AS (
    SELECT amount, CASE WHEN amount >= %(amount)s THEN NULL
                        WHEN amount = cap THEN 'priority_cap'
                        WHEN amount = budget THEN 'budget'
                        ELSE 'autobidder_budget' END AS capped_by
    FROM charge
),
entry AS (
    INSERT INTO accounts_ledgerentry
        (request_id, kind, tenant_id, api_key_id, market_id, round_id, amount, detail, created_at)
    SELECT q.request_id, %(kind)s, q.tenant_id, q.api_key_id, q.market_id, %(round_id)s, c.amount,
           CASE WHEN c.capped_by IS NULL THEN %(detail)s
                ELSE %(detail)s || jsonb_build_object('capped_at', c.amount::text,
                    'capped_by', c.capped_by, 'uncapped', %(amount)s::text) END,
           %(now)s
    FROM live q, capped c
    ON CONFLICT (request_id, kind) DO NOTHING
    RETURNING id, tenant_id, api_key_id, amount
),
request_charged AS (
    UPDATE accounts_request SET {{request_set}}
    WHERE request_id = %(request_id)s AND EXISTS (SELECT FROM entry)
){{pending_stored}},
hold_consumed AS (
    UPDATE accounts_hold h SET
        remaining = CASE WHEN k.close THEN 0
                         ELSE LEAST(hold.remaining - LEAST(e.amount, hold.remaining),
                                    COALESCE(q.priority_cap, hold.remaining)) END,
        state = CASE WHEN k.close THEN 'settled' ELSE 'open' END,
        closed_at = CASE WHEN k.close THEN %(now)s END
    FROM hold, entry e, live q, (SELECT {{closes}} AS close FROM live q) k
    WHERE h.id = hold.id
    RETURNING hold.remaining - h.remaining AS released
),
counted AS (
    UPDATE accounts_budgetcounter c SET
        held = c.held - COALESCE((SELECT sum(released) FROM hold_consumed), 0),
        spent_total = c.spent_total + e.amount,
        day_spent = CASE WHEN c.day_start = %(day)s THEN c.day_spent + e.amount
                         WHEN c.day_start < %(day)s THEN e.amount ELSE c.day_spent END,
        day_start = GREATEST(c.day_start, %(day)s),
        week_spent = CASE WHEN c.week_start = %(week)s THEN c.week_spent + e.amount
                          WHEN c.week_start < %(week)s THEN e.amount ELSE c.week_spent END,
        week_start = GREATEST(c.week_start, %(week)s),
        month_spent = CASE WHEN c.month_start = %(month)s THEN c.month_spent + e.amount
                           WHEN c.month_start < %(month)s THEN e.amount ELSE c.month_spent END,
        month_start = GREATEST(c.month_start, %(month)s)
    FROM counter, entry e WHERE c.id = counter.id
){{autobid_counted}}
SELECT q.status, q.counted, (SELECT id FROM entry), q.tenant_id, q.api_key_id, q.market_id,
       q.priced, (SELECT amount FROM entry), (SELECT capped_by FROM capped WHERE EXISTS
       (SELECT FROM entry)), {{pending_out}}
FROM request q
"""

_PRIORITY = {
    # Only a served request pays its priority charge; a queued one keeps it pending.
    "writes_when": "status = 'served'",
    # An autobid request's charge: its autobidder's budget, locked last.
    "autobidder": f"""
    SELECT a.id, a.budget - CASE WHEN a.spent_start < {_AUTOBID_WINDOW} THEN 0
                                 ELSE a.spent_in_window END AS room
    FROM accounts_autobidder a, live q
    WHERE a.tenant_id = q.tenant_id AND q.bid_source = 'autobid'
      AND (SELECT count(*) FROM counter) >= 0
    FOR UPDATE OF a
""",
    "request_set": "admitted_at = COALESCE(admitted_at, %(now)s), priority_pending = NULL",
    "cap": "live.priority_cap",
    "closes": "TRUE",  # the token charge is already settled
    "pending_stored": """,
pending_stored AS (
    UPDATE accounts_request r SET admitted_at = COALESCE(r.admitted_at, %(now)s),
        priority_pending = jsonb_build_object('amount', %(amount)s::text,
                                              'round_id', %(round_id)s, 'detail', %(detail)s)
    FROM request q
    WHERE r.request_id = q.request_id AND q.status = 'queued' AND q.priority_pending IS NULL
    RETURNING 1
)""",
    "pending_out": "(SELECT count(*) FROM pending_stored) > 0, NULL::jsonb",
    "autobid_counted": f""",

autobid_counted AS (
    UPDATE accounts_autobidder a SET
        spent_in_window = CASE WHEN a.spent_start = {_AUTOBID_WINDOW}
                                   THEN a.spent_in_window + e.amount
                               WHEN a.spent_start < {_AUTOBID_WINDOW} THEN e.amount
                               ELSE a.spent_in_window END,
        spent_start = GREATEST(a.spent_start, {_AUTOBID_WINDOW})
    FROM autobidder, entry e WHERE a.id = autobidder.id
)""",
}
_TOKENS = {
    "writes_when": "TRUE",
    "autobidder": "SELECT NULL::bigint AS id, NULL::numeric AS room WHERE FALSE",
    "request_set": """status = 'served', finished_at = %(now)s,
        prompt_tokens = %(prompt_tokens)s, cached_tokens = %(cached_tokens)s,
        completion_tokens = %(completion_tokens)s,
        ttft_s = COALESCE(%(ttft_s)s, ttft_s), e2e_s = COALESCE(%(e2e_s)s, e2e_s)""",
    "cap": "NULL::numeric",
    # The hold stays open for the priority part still to come, unless there is none.
    "closes": """(q.priority_pending IS NULL AND (q.priority_cap IS NULL OR q.priority_cap = 0))
        OR EXISTS (SELECT FROM accounts_ledgerentry p WHERE p.request_id = q.request_id
                                                        AND p.kind = 'priority')""",
    "pending_stored": "",
    # The priority charge left pending, for the caller to write next.
    "pending_out": "FALSE, CASE WHEN EXISTS (SELECT FROM entry) THEN q.priority_pending END",
    "autobid_counted": "",
}
_MARKET_JOIN = "JOIN market_market m ON m.id = r.market_id AND m.slug = %(market_slug)s"
# A token charge computed by the caller from prices it read earlier is written only if they are
# still the market's (else the statement declines and the prices are read again).
_PRICED = """(SELECT (m.id, m.price_input_per_mtok, m.price_cached_input_per_mtok,
                 m.price_output_per_mtok) = (%(market)s, %(price_input)s, %(price_cached)s,
                                             %(price_output)s)
            FROM market_market m WHERE m.id = r.market_id)"""
CHARGE_SQL = {  # by (kind, charged only in the market of this slug, priced by the caller)
    (kind, by_slug, priced): _typed(
        _CHARGE_SQL.format(
            market_join=_MARKET_JOIN if by_slug else "",
            priced=_PRICED if priced else "TRUE",
            **(_PRIORITY if kind == "priority" else _TOKENS),
        )
    )
    for kind, by_slug, priced in [
        ("priority", False, False),
        ("priority", True, False),
        ("tokens", False, False),
        ("tokens", False, True),
    ]
}


@dataclass(frozen=True)
class ChargeOutcome:
    """What the charge statement did. ``status`` is None for an unknown request (or one of
    another market); ``entry_id`` is set when it wrote the entry; else, when ``counted`` is
    false and the request has not failed, it declined, and when ``priced`` is false the
    prices it was given are no longer the market's. ``pending_stored``: a priority charge of a
    queued request was kept pending on its row; ``pending``: after a token charge, the priority
    charge that was pending (amount, round_id, detail), for the caller to write now."""

    status: str | None
    counted: bool
    entry_id: int | None
    tenant_id: int | None = None
    api_key_id: int | None = None
    market_id: int | None = None
    priced: bool = True
    amount: Decimal | None = None  # as written: it may be capped (``capped_by`` says by what)
    capped_by: str | None = None
    pending_stored: bool = False
    pending: dict[str, Any] | None = None


def charge_write(
    *,
    request_id: str,
    kind: str,
    amount: Decimal,
    round_id: str,
    detail: dict[str, Any],
    now: datetime,
    market_slug: str | None = None,
    tokens: dict[str, Any] | None = None,
    prices: dict[str, Any] | None = None,
) -> ChargeOutcome:
    """Write the ``kind`` entry ("priority" or "tokens") of at most ``amount`` dollars for a
    request (``accounts.ledger.rules``), consume its hold and count the charge, unless the
    request failed or the entry exists; a priority charge of a queued request is kept pending
    instead. ``market_slug``: charge only a request of that market; ``tokens`` (token
    charges): the token counts and latencies the request keeps; ``prices`` (market,
    price_input, price_cached, price_output): the market and prices ``amount`` was computed
    from, written only if they are still the request's market's."""
    sql = CHARGE_SQL[(kind, market_slug is not None, prices is not None)]
    params = {
        "request_id": request_id,
        "kind": kind,
        "amount": amount,
        "round_id": round_id,
        "detail": json.dumps(detail),
        "now": now,
        **({"market_slug": market_slug} if market_slug is not None else {}),
        **_windows(now),
        **(tokens or {}),
        **(prices or {}),
    }
    with _cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return ChargeOutcome(status=None, counted=True, entry_id=None)
    *head, pending = row
    # Django has psycopg hand jsonb over as text (its JSONField decodes it).
    return ChargeOutcome(*head, pending=json.loads(pending) if pending is not None else None)


_RELEASE_SQL_UNTYPED = f"""
WITH request AS (
    SELECT request_id, status FROM accounts_request WHERE request_id = %(request_id)s
    FOR UPDATE
),
hold AS (
    SELECT h.id, h.remaining, h.tenant_id, h.api_key_id,
           {_COUNTERS_FOUND.format(tenant="h.tenant_id", key="h.api_key_id")}
               = {_COUNTERS_NEEDED.format(key="h.api_key_id")} AS counted
    FROM accounts_hold h
    WHERE h.request_id = %(request_id)s AND h.state = 'open'
      AND (SELECT count(*) FROM request) >= 0  -- the request's lock first, then the hold's
    FOR UPDATE OF h
),
go AS (SELECT NOT EXISTS (SELECT FROM hold WHERE NOT counted) AS ok),
failed AS (
    UPDATE accounts_request r SET status = 'failed', finished_at = %(now)s
    FROM request, go
    WHERE %(fail)s AND go.ok AND r.request_id = request.request_id AND request.status = 'queued'
    RETURNING r.request_id
),
released AS (
    UPDATE accounts_hold h SET state = 'released', remaining = 0, closed_at = %(now)s
    FROM hold, go WHERE go.ok AND h.id = hold.id
    RETURNING hold.remaining, hold.tenant_id, hold.api_key_id
),
counter AS (
    SELECT c.id FROM accounts_budgetcounter c, released r
    WHERE c.tenant_id = r.tenant_id AND (c.api_key_id IS NULL OR c.api_key_id = r.api_key_id)
    ORDER BY c.api_key_id NULLS FIRST
    FOR UPDATE OF c
),
counted AS (
    UPDATE accounts_budgetcounter c SET held = c.held - (SELECT remaining FROM released)
    FROM counter WHERE c.id = counter.id
)
SELECT (SELECT ok FROM go), (SELECT count(*) FROM request), (SELECT count(*) FROM failed),
       (SELECT count(*) FROM released)
"""
_RELEASE_SQL = _typed(_RELEASE_SQL_UNTYPED)


@dataclass(frozen=True)
class ReleaseOutcome:
    """What the release statement did; when ``counted`` is false it declined (wrote nothing)."""

    counted: bool
    request_found: bool
    failed: bool  # the request was queued and is now failed
    released: bool  # its open hold was released


def hold_close(*, request_id: str, now: datetime, fail_request: bool) -> ReleaseOutcome:
    """Release the open hold of ``request_id`` (nothing charged) and, with ``fail_request``,
    mark the request failed if it was still queued."""
    params = {"request_id": request_id, "now": now, "fail": fail_request}
    with _cursor() as cursor:
        cursor.execute(_RELEASE_SQL, params)
        counted, found, failed, released = cursor.fetchone()
    return ReleaseOutcome(
        counted=counted, request_found=found > 0, failed=failed > 0, released=released > 0
    )


_PRICES_SQL = _typed("""
SELECT m.price_input_per_mtok, m.price_cached_input_per_mtok, m.price_output_per_mtok
FROM accounts_request r JOIN market_market m ON m.id = r.market_id
WHERE r.request_id = %(request_id)s
""")


def request_prices(*, request_id: str) -> tuple[Decimal, Decimal, Decimal] | None:
    """The posted prices (dollars per million input, cached input and output tokens) of the
    market of ``request_id``; None for an unknown request."""
    with _cursor() as cursor:
        cursor.execute(_PRICES_SQL, {"request_id": request_id})
        return cursor.fetchone()
