"""A request settled, one statement (the package's docstring says how it locks and when it
declines), and the prices a request was admitted at."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from accounts import rules
from accounts.algebra import SQL
from accounts.models.budgets import WINDOWED_PERIODS
from accounts.models.ledger import TOKEN_COUNTS
from accounts.money import Prices

from .sql import (
    COUNTERS_FOUND,
    COUNTERS_NEEDED,
    WINDOW_SPENT_AT_MOST,
    prepared_cursor,
    typed,
    window_bound,
    window_counted,
    windows,
)

# The start of the autobidder's window at the statement's time.
_AUTOBID_WINDOW = window_bound("a.period")
# What the autobidder's budget has left (``rules.left`` of ``rules.window_spent_at_most``).
_AUTOBID_LEFT = rules.left(
    SQL,
    limit="a.budget",
    spent=rules.window_spent_at_most(
        SQL, kept_start="a.spent_start", kept_spent="a.spent_in_window", start=_AUTOBID_WINDOW
    ),
    held=SQL.zero,
)
# What the settlement may write (``rules.settlement``), over the ``inputs`` row ``i``.
_TOKENS, _TOKENS_CUT, _PRIORITY, _PRIORITY_CUT = rules.settlement(
    SQL,
    tokens="i.tokens",
    priority="i.priority",
    priority_cap="i.cap",
    hold_remaining="i.hold",
    budget_room="i.budget_room",
    autobidder_room="i.autobid_room",
)


# Every window of the counter rows ``c`` and the autobidder's ``a`` counts the entries ``e``.
_COUNTERS_COUNTED = ",\n        ".join(
    window_counted(
        "c", start=f"{p}_start", spent=f"{p}_spent", window=f"%({p})s", amount="e.amount"
    )
    for p in WINDOWED_PERIODS
)
_AUTOBID_COUNTED = window_counted(
    "a", start="spent_start", spent="spent_in_window", window=_AUTOBID_WINDOW, amount="e.amount"
)

SETTLE_SQL = typed(f"""
WITH request AS (
    SELECT r.request_id, r.tenant_id, r.api_key_id, r.market_id, r.status, r.priority_cap,
           r.bid_source,
           {COUNTERS_FOUND.format(tenant="r.tenant_id", key="r.api_key_id")}
               = {COUNTERS_NEEDED.format(key="r.api_key_id")} AS counted,
           (m.price_input_per_mtok, m.price_cached_input_per_mtok, m.price_output_per_mtok)
               = (%(price_input)s, %(price_cached)s, %(price_output)s) AS priced
    FROM accounts_request r JOIN market_market m ON m.id = r.market_id
    WHERE r.request_id = %(request_id)s
    FOR UPDATE OF r
),
live AS (  -- the request, when this statement settles it
    SELECT * FROM request WHERE status = 'queued' AND counted AND priced
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
autobidder AS (  -- an autobid request's priority charge: its autobidder's budget, locked last
    SELECT a.id, {_AUTOBID_LEFT} AS room
    FROM accounts_autobidder a, live q
    WHERE a.tenant_id = q.tenant_id AND q.bid_source = 'autobid'
      AND %(priority)s IS NOT NULL AND (SELECT count(*) FROM counter) >= 0
    FOR UPDATE OF a
),
budget AS (
    SELECT min({rules.left(SQL, limit='b."limit"', spent=WINDOW_SPENT_AT_MOST, held="c.held")})
           AS room
    FROM accounts_budget b JOIN counter c ON c.api_key_id IS NOT DISTINCT FROM b.api_key_id
    WHERE b.tenant_id = (SELECT tenant_id FROM live)
      AND (b.api_key_id IS NULL OR b.api_key_id = (SELECT api_key_id FROM live))
),
inputs AS MATERIALIZED (  -- rules.settlement's operands, once (NULL: none)
    SELECT %(tokens)s AS tokens, %(priority)s AS priority, live.priority_cap AS cap,
           COALESCE((SELECT remaining FROM hold), 0) AS hold, budget.room AS budget_room,
           (SELECT a.room FROM autobidder a) AS autobid_room
    FROM live, budget
),
settled AS (
    SELECT {_TOKENS} AS tokens, {_TOKENS_CUT} AS tokens_cut, {_PRIORITY} AS priority,
           {_PRIORITY_CUT} AS priority_cut
    FROM inputs i
),
entries AS (
    INSERT INTO accounts_ledgerentry
        (request_id, kind, tenant_id, api_key_id, market_id, round_id, amount, detail, created_at)
    SELECT q.request_id, 'tokens', q.tenant_id, q.api_key_id, q.market_id, '', s.tokens,
           CASE WHEN s.tokens_cut IS NULL THEN %(tokens_detail)s
                ELSE %(tokens_detail)s || jsonb_build_object('capped_at', s.tokens::text,
                    'capped_by', s.tokens_cut, 'uncapped', %(tokens)s::text) END,
           %(now)s
    FROM live q, settled s
    UNION ALL
    SELECT q.request_id, 'priority', q.tenant_id, q.api_key_id, q.market_id, %(round_id)s,
           s.priority,
           CASE WHEN s.priority_cut IS NULL THEN %(priority_detail)s
                ELSE %(priority_detail)s || jsonb_build_object('capped_at', s.priority::text,
                    'capped_by', s.priority_cut, 'uncapped', %(priority)s::text) END,
           %(now)s
    FROM live q, settled s WHERE %(priority)s IS NOT NULL
    RETURNING id, kind, amount, detail
),
request_served AS (
    UPDATE accounts_request SET status = 'served', finished_at = %(now)s,
        prompt_tokens = %(prompt_tokens)s, cached_tokens = %(cached_tokens)s,
        completion_tokens = %(completion_tokens)s, ttft_s = %(ttft_s)s, e2e_s = %(e2e_s)s
    WHERE request_id = %(request_id)s AND EXISTS (SELECT FROM entries)
),
hold_settled AS (
    UPDATE accounts_hold h SET remaining = 0, state = 'settled', closed_at = %(now)s
    FROM hold WHERE h.id = hold.id AND EXISTS (SELECT FROM entries)
),
charged AS (SELECT sum(amount) AS amount FROM entries),
counted AS (
    UPDATE accounts_budgetcounter c SET
        held = c.held - COALESCE((SELECT remaining FROM hold), 0),
        spent_total = c.spent_total + e.amount,
        {_COUNTERS_COUNTED}
    FROM counter, charged e WHERE c.id = counter.id AND e.amount IS NOT NULL
),
autobid_counted AS (
    UPDATE accounts_autobidder a SET {_AUTOBID_COUNTED}
    FROM autobidder, entries e WHERE a.id = autobidder.id AND e.kind = 'priority'
)
SELECT q.status, q.counted, q.priced, q.tenant_id, q.api_key_id, q.market_id,
       (SELECT id FROM entries WHERE kind = 'tokens'),
       (SELECT amount FROM entries WHERE kind = 'tokens'),
       (SELECT detail::text FROM entries WHERE kind = 'tokens'),
       (SELECT id FROM entries WHERE kind = 'priority'),
       (SELECT amount FROM entries WHERE kind = 'priority'),
       (SELECT detail::text FROM entries WHERE kind = 'priority')
FROM request q
""")


@dataclass(frozen=True)
class SettleOutcome:
    """What the settle statement did. ``status`` is None for an unknown request; the entries'
    ids are set when it settled the request (``status`` is then its status before: queued);
    else, when ``counted`` is false and the request is queued, it declined, and when ``priced``
    is false the prices it was given are no longer the market's."""

    status: str | None
    counted: bool = True
    priced: bool = True
    tenant_id: int | None = None
    api_key_id: int | None = None
    market_id: int | None = None
    tokens_id: int | None = None
    tokens_amount: Decimal | None = None  # as written: it may be cut (to the budget)
    tokens_detail: str | None = None  # as written (JSON): with what a cap cut, if one did
    priority_id: int | None = None
    priority_amount: Decimal | None = None
    priority_detail: str | None = None


def request_settle(
    *,
    request_id: str,
    usage: dict[str, Any],
    tokens: Decimal,
    priority: Decimal | None,
    round_id: str,
    priority_detail: dict[str, Any] | None,
    prices: tuple[Decimal, Decimal, Decimal],
    now: datetime,
) -> SettleOutcome:
    """Settle a queued request (``accounts.rules.settlement``): its token entry
    of at most ``tokens`` dollars and, unless ``priority`` is None, its priority entry of at most
    ``priority``; close its hold, count both, mark it served with ``usage`` (prompt_tokens,
    cached_tokens, completion_tokens, ttft_s, e2e_s). ``prices`` (input, cached input, output per
    million) are those ``tokens`` was computed from: written only if they are still the
    request's market's."""
    params = {
        "request_id": request_id,
        "tokens": tokens,
        "priority": priority,
        "round_id": round_id,
        "tokens_detail": json.dumps({k: usage[k] for k in TOKEN_COUNTS}),
        "priority_detail": json.dumps(priority_detail or {}),
        "price_input": prices[0],
        "price_cached": prices[1],
        "price_output": prices[2],
        "now": now,
        **windows(now),
        **usage,
    }
    with prepared_cursor() as cursor:
        cursor.execute(SETTLE_SQL, params)
        row = cursor.fetchone()
    if row is None:
        return SettleOutcome(status=None)
    return SettleOutcome(*row)


_PRICES_SQL = typed("""
SELECT m.price_input_per_mtok, m.price_cached_input_per_mtok, m.price_output_per_mtok
FROM accounts_request r JOIN market_market m ON m.id = r.market_id
WHERE r.request_id = %(request_id)s
""")


def request_prices(*, request_id: str) -> Prices | None:
    """The posted prices (dollars per million input, cached input and output tokens) of the
    market of ``request_id``; None for an unknown request."""
    with prepared_cursor() as cursor:
        cursor.execute(_PRICES_SQL, {"request_id": request_id})
        row = cursor.fetchone()
    return None if row is None else Prices(*row)
