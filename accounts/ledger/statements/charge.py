"""A charge written, one statement (the package's docstring says how it locks and when it
declines), and the prices a request was admitted at."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from .sql import COUNTERS_FOUND, COUNTERS_NEEDED, WINDOW_SPENT, prepared_cursor, typed, windows

# A budget's window spend for the charge rule (``accounts.ledger.rules``): as WINDOW_SPENT, and
# when the statement's clock is behind the row's window, the row's newer window (the most that
# window can have spent; the reference code reads it the same way).
_ROOM_SPENT = f"""COALESCE({WINDOW_SPENT}, CASE b.period WHEN 'day' THEN c.day_spent
    WHEN 'week' THEN c.week_spent WHEN 'month' THEN c.month_spent END)"""
# The start of the autobidder's window at the statement's time.
_AUTOBID_WINDOW = """CASE a.period WHEN 'day' THEN %(day)s WHEN 'week' THEN %(week)s
    WHEN 'month' THEN %(month)s END"""

_CHARGE_SQL = f"""
WITH request AS (
    SELECT r.request_id, r.tenant_id, r.api_key_id, r.market_id, r.status, r.priority_cap,
           r.bid_source, r.priority_pending,
           {COUNTERS_FOUND.format(tenant="r.tenant_id", key="r.api_key_id")}
               = {COUNTERS_NEEDED.format(key="r.api_key_id")} AS counted,
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
    (kind, by_slug, priced): typed(
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
        **windows(now),
        **(tokens or {}),
        **(prices or {}),
    }
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return ChargeOutcome(status=None, counted=True, entry_id=None)
    *head, pending = row
    # Django has psycopg hand jsonb over as text (its JSONField decodes it).
    return ChargeOutcome(*head, pending=json.loads(pending) if pending is not None else None)


_PRICES_SQL = typed("""
SELECT m.price_input_per_mtok, m.price_cached_input_per_mtok, m.price_output_per_mtok
FROM accounts_request r JOIN market_market m ON m.id = r.market_id
WHERE r.request_id = %(request_id)s
""")


def request_prices(*, request_id: str) -> tuple[Decimal, Decimal, Decimal] | None:
    """The posted prices (dollars per million input, cached input and output tokens) of the
    market of ``request_id``; None for an unknown request."""
    with prepared_cursor() as cursor:
        cursor.execute(_PRICES_SQL, {"request_id": request_id})
        return cursor.fetchone()
