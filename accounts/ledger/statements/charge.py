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
    Statement,
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
# What a settlement writes when no budget cuts it (the consent cap still may), over the
# ``live`` row ``q``: what the batch's running sums count for the requests before a request.
_UNCUT_TOKENS, _, _UNCUT_PRIORITY, _ = rules.settlement(
    SQL,
    tokens="q.tokens",
    priority="q.priority",
    priority_cap="q.priority_cap",
    hold_remaining=SQL.zero,
    budget_room=SQL.null,
    autobidder_room=SQL.null,
)
# Whether a charge counted on the counter row ``c`` adds to what the budget ``b`` reads as
# spent (``rules.window_spent_at_most`` after ``rules.window_counted``): always, but for a window
# older than the row's (the writer's clock behind it), which the row does not count.
_COUNTS_IN_WINDOW = "CASE b.period WHEN 'none' THEN true {whens} END".format(
    whens=" ".join(f"WHEN '{p}' THEN %({p})s >= c.{p}_start" for p in WINDOWED_PERIODS)
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
WITH item AS (  -- the batch, in arrival order (n)
    SELECT * FROM unnest(%(request_ids)s, %(tokens_asked)s, %(priorities)s, %(round_ids)s,
                         %(tokens_details)s, %(priority_details)s, %(prices_input)s,
                         %(prices_cached)s, %(prices_output)s, %(prompt_tokens_each)s,
                         %(cached_tokens_each)s, %(completion_tokens_each)s, %(ttft_s_each)s,
                         %(e2e_s_each)s)
        WITH ORDINALITY AS i(request_id, tokens, priority, round_id, tokens_detail,
                             priority_detail, price_input, price_cached, price_output,
                             prompt_tokens, cached_tokens, completion_tokens, ttft_s, e2e_s, n)
),
request AS (
    SELECT i.n, r.request_id, r.tenant_id, r.api_key_id, r.market_id, r.status, r.priority_cap,
           r.bid_source,
           {COUNTERS_FOUND.format(tenant="r.tenant_id", key="r.api_key_id")}
               = {COUNTERS_NEEDED.format(key="r.api_key_id")} AS counted,
           (m.price_input_per_mtok, m.price_cached_input_per_mtok, m.price_output_per_mtok)
               = (i.price_input, i.price_cached, i.price_output) AS priced
    FROM item i JOIN accounts_request r ON r.request_id = i.request_id
         JOIN market_market m ON m.id = r.market_id
    ORDER BY r.request_id
    FOR UPDATE OF r
),
live AS (  -- the requests this statement may settle
    SELECT q.*, i.tokens, i.priority FROM request q JOIN item i ON i.n = q.n
    WHERE q.status = 'queued' AND q.counted AND q.priced
),
hold AS (
    SELECT h.id, h.request_id, h.remaining FROM accounts_hold h
    WHERE h.request_id IN (SELECT request_id FROM live) AND h.state = 'open'
      AND (SELECT count(*) FROM request) >= 0  -- the requests' locks first, then these
    ORDER BY h.request_id
    FOR UPDATE OF h
),
counter AS (
    SELECT c.id, c.tenant_id, c.api_key_id, c.held, c.spent_total, c.day_start, c.day_spent,
           c.week_start, c.week_spent, c.month_start, c.month_spent
    FROM accounts_budgetcounter c
    WHERE c.tenant_id IN (SELECT tenant_id FROM live)
      AND (c.api_key_id IS NULL OR c.api_key_id IN (SELECT api_key_id FROM live))
      AND (SELECT count(*) FROM hold) >= 0  -- the holds' locks first, then these
    ORDER BY c.tenant_id, c.api_key_id NULLS FIRST
    FOR UPDATE OF c
),
autobidder AS (  -- autobid requests' priority charges: their autobidders' budgets, locked last
    SELECT a.id, a.tenant_id, {_AUTOBID_LEFT} AS room,
           {_AUTOBID_WINDOW} >= a.spent_start AS counts
    FROM accounts_autobidder a
    WHERE a.tenant_id IN (SELECT tenant_id FROM live
                          WHERE bid_source = 'autobid' AND priority IS NOT NULL)
      AND (SELECT count(*) FROM counter) >= 0
    ORDER BY a.id
    FOR UPDATE OF a
),
budget AS (  -- each budget of a tenant in the batch, what it has left before the batch
    SELECT b.id, b.tenant_id, b.api_key_id,
           {rules.left(SQL, limit='b."limit"', spent=WINDOW_SPENT_AT_MOST, held="c.held")}
               AS room,
           {_COUNTS_IN_WINDOW} AS counts
    FROM accounts_budget b JOIN counter c
         ON c.tenant_id = b.tenant_id AND c.api_key_id IS NOT DISTINCT FROM b.api_key_id
),
asked AS MATERIALIZED (  -- what each request writes when no budget cuts it
    SELECT q.*, COALESCE(h.remaining, 0) AS hold,
           {_UNCUT_TOKENS} + (CASE WHEN q.priority IS NULL THEN 0 ELSE {_UNCUT_PRIORITY} END)
               AS charge,
           CASE WHEN q.priority IS NULL THEN 0 ELSE {_UNCUT_PRIORITY} END AS paid
    FROM live q LEFT JOIN hold h ON h.request_id = q.request_id
),
budget_room AS MATERIALIZED (  -- what each budget has left at a request's turn, if no
    -- request before it in the batch was cut (the charges before it are then the uncut ones)
    SELECT a.n, b.room + COALESCE(sum(a.hold - CASE WHEN b.counts THEN a.charge ELSE 0 END)
               OVER (PARTITION BY b.id ORDER BY a.n
                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS room
    FROM asked a JOIN budget b ON b.tenant_id = a.tenant_id
         AND (b.api_key_id IS NULL OR b.api_key_id = a.api_key_id)
),
autobid_room AS MATERIALIZED (
    SELECT a.n, x.room - COALESCE(sum(CASE WHEN x.counts THEN a.paid ELSE 0 END)
               OVER (PARTITION BY x.id ORDER BY a.n
                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS room
    FROM asked a JOIN autobidder x ON x.tenant_id = a.tenant_id
    WHERE a.bid_source = 'autobid' AND a.priority IS NOT NULL
),
least_room AS (SELECT n, min(room) AS room FROM budget_room GROUP BY n),
inputs AS MATERIALIZED (  -- rules.settlement's operands, once (NULL: none)
    SELECT a.*, a.priority_cap AS cap, b.room AS budget_room, x.room AS autobid_room
    FROM asked a LEFT JOIN least_room b ON b.n = a.n LEFT JOIN autobid_room x ON x.n = a.n
),
ruled AS (
    SELECT i.n, i.request_id, i.tenant_id, i.api_key_id, i.market_id, i.hold,
           {_TOKENS} AS tokens, {_TOKENS_CUT} AS tokens_cut, {_PRIORITY} AS priority,
           CASE WHEN i.priority IS NOT NULL THEN {_PRIORITY_CUT} END AS priority_cut
    FROM inputs i
),
first_cut AS (  -- each tenant's first request in the batch that a budget cut
    SELECT tenant_id, min(n) AS n FROM ruled
    WHERE tokens_cut IS NOT NULL OR priority_cut <> '{rules.PRIORITY_CAP}'
    GROUP BY tenant_id
),
settled AS MATERIALIZED (  -- a tenant's requests up to its first one a budget cut: the rest wait
    SELECT r.* FROM ruled r LEFT JOIN first_cut f ON f.tenant_id = r.tenant_id
    WHERE f.n IS NULL OR r.n <= f.n
),
entries AS (
    INSERT INTO accounts_ledgerentry
        (request_id, kind, tenant_id, api_key_id, market_id, round_id, amount, detail, created_at)
    SELECT s.request_id, 'tokens', s.tenant_id, s.api_key_id, s.market_id, '', s.tokens,
           CASE WHEN s.tokens_cut IS NULL THEN i.tokens_detail
                ELSE i.tokens_detail || jsonb_build_object('capped_at', s.tokens::text,
                    'capped_by', s.tokens_cut, 'uncapped', i.tokens::text) END,
           %(now)s
    FROM settled s JOIN item i ON i.n = s.n
    UNION ALL
    SELECT s.request_id, 'priority', s.tenant_id, s.api_key_id, s.market_id, i.round_id,
           s.priority,
           CASE WHEN s.priority_cut IS NULL THEN i.priority_detail
                ELSE i.priority_detail || jsonb_build_object('capped_at', s.priority::text,
                    'capped_by', s.priority_cut, 'uncapped', i.priority::text) END,
           %(now)s
    FROM settled s JOIN item i ON i.n = s.n WHERE i.priority IS NOT NULL
    RETURNING id, request_id, kind, amount, detail
),
request_served AS (
    UPDATE accounts_request r SET status = 'served', finished_at = %(now)s,
        prompt_tokens = i.prompt_tokens, cached_tokens = i.cached_tokens,
        completion_tokens = i.completion_tokens, ttft_s = i.ttft_s, e2e_s = i.e2e_s
    FROM settled s JOIN item i ON i.n = s.n
    WHERE r.request_id = s.request_id
),
hold_settled AS (
    UPDATE accounts_hold h SET remaining = 0, state = 'settled', closed_at = %(now)s
    FROM hold, settled s WHERE h.id = hold.id AND hold.request_id = s.request_id
),
charged AS (  -- each counter row's share of the batch: holds closed, charges written
    SELECT c.id, sum(s.hold) AS released,
           sum(s.tokens + COALESCE(CASE WHEN i.priority IS NOT NULL THEN s.priority END, 0))
               AS amount
    FROM counter c JOIN settled s ON s.tenant_id = c.tenant_id
         AND (c.api_key_id IS NULL OR c.api_key_id = s.api_key_id)
         JOIN item i ON i.n = s.n
    GROUP BY c.id
),
counted AS (
    UPDATE accounts_budgetcounter c SET
        held = c.held - e.released,
        spent_total = c.spent_total + e.amount,
        {_COUNTERS_COUNTED}
    FROM charged e WHERE c.id = e.id
),
autobid_charged AS (
    SELECT x.id, sum(s.priority) AS amount
    FROM autobidder x JOIN settled s ON s.tenant_id = x.tenant_id
         JOIN live q ON q.n = s.n
    WHERE q.bid_source = 'autobid' AND q.priority IS NOT NULL
    GROUP BY x.id
),
autobid_counted AS (
    UPDATE accounts_autobidder a SET {_AUTOBID_COUNTED}
    FROM autobid_charged e WHERE a.id = e.id
),
written AS (  -- each settled request's entries, in one row
    SELECT request_id,
           max(id) FILTER (WHERE kind = 'tokens') AS tokens_id,
           max(amount) FILTER (WHERE kind = 'tokens') AS tokens_amount,
           max(detail::text) FILTER (WHERE kind = 'tokens') AS tokens_detail,
           max(id) FILTER (WHERE kind = 'priority') AS priority_id,
           max(amount) FILTER (WHERE kind = 'priority') AS priority_amount,
           max(detail::text) FILTER (WHERE kind = 'priority') AS priority_detail
    FROM entries GROUP BY request_id
)
SELECT q.status, q.counted, q.priced, q.tenant_id, q.api_key_id, q.market_id,
       s.n IS NULL AND q.n IN (SELECT n FROM live),
       w.tokens_id, w.tokens_amount, w.tokens_detail,
       w.priority_id, w.priority_amount, w.priority_detail
FROM item i LEFT JOIN request q ON q.n = i.n LEFT JOIN settled s ON s.n = i.n
     LEFT JOIN written w ON w.request_id = s.request_id
ORDER BY i.n
""")


@dataclass(frozen=True)
class SettleAsk:
    """One request of a settle statement's batch: its token charge of at most ``tokens``
    dollars and, unless ``priority`` is None, its priority charge of at most ``priority``;
    ``usage`` (prompt_tokens, cached_tokens, completion_tokens, ttft_s, e2e_s) marks it served;
    ``prices`` (input, cached input, output per million) are those ``tokens`` was computed
    from: written only if they are still the request's market's."""

    request_id: str
    usage: dict[str, Any]
    tokens: Decimal
    priority: Decimal | None
    round_id: str
    priority_detail: dict[str, Any] | None
    prices: tuple[Decimal, Decimal, Decimal]


@dataclass(frozen=True)
class SettleOutcome:
    """What the settle statement did with one request. ``status`` is None for an unknown
    request; the entries' ids are set when it settled the request (``status`` is then its
    status before: queued); else, when ``counted`` is false and the request is queued, it
    declined, when ``priced`` is false the prices it was given are no longer the market's, and
    when ``waits`` is true an earlier request of its tenant in the batch was cut by a budget:
    it is for the next statement."""

    status: str | None
    counted: bool = True
    priced: bool = True
    tenant_id: int | None = None
    api_key_id: int | None = None
    market_id: int | None = None
    waits: bool = False
    tokens_id: int | None = None
    tokens_amount: Decimal | None = None  # as written: it may be cut (to the budget)
    tokens_detail: str | None = None  # as written (JSON): with what a cap cut, if one did
    priority_id: int | None = None
    priority_amount: Decimal | None = None
    priority_detail: str | None = None


def requests_settle(*, asks: list[SettleAsk], now: datetime) -> list[SettleOutcome]:
    """Settle the queued requests of ``asks`` (distinct request ids, in arrival order) as if one
    after another (``accounts.rules.settlement``), in one statement: each its entries, its
    hold closed, both counted, marked served. A request after one its tenant's budget cut
    waits (``waits``): the running sums that check each request against what the ones before
    it left hold only while none was cut. The outcomes, in the order of ``asks``."""
    return settle_statement(asks=asks, now=now).run()


def settle_statement(*, asks: list[SettleAsk], now: datetime) -> Statement[list[SettleOutcome]]:
    """:func:`requests_settle`'s statement, to run on any connection."""
    params = {
        "request_ids": [a.request_id for a in asks],
        "tokens_asked": [a.tokens for a in asks],
        "priorities": [a.priority for a in asks],
        "round_ids": [a.round_id for a in asks],
        "tokens_details": [json.dumps({k: a.usage[k] for k in TOKEN_COUNTS}) for a in asks],
        "priority_details": [json.dumps(a.priority_detail or {}) for a in asks],
        "prices_input": [a.prices[0] for a in asks],
        "prices_cached": [a.prices[1] for a in asks],
        "prices_output": [a.prices[2] for a in asks],
        **{f"{name}_each": [a.usage[name] for a in asks] for name in _USAGE},
        "now": now,
        **windows(now),
    }
    return Statement(SETTLE_SQL, params, _settle_outcomes)


def _settle_outcomes(rows: list[tuple[Any, ...]]) -> list[SettleOutcome]:
    return [SettleOutcome(*row) for row in rows]


_USAGE = ("prompt_tokens", "cached_tokens", "completion_tokens", "ttft_s", "e2e_s")


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
