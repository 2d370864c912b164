"""A hold placed and a hold closed, one statement each (the package's docstring says how they
lock and when they decline), and the lock of a tenant's and key's counter rows."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from accounts import rules
from accounts.algebra import SQL

from .sql import (
    COUNTERS_FOUND,
    COUNTERS_NEEDED,
    LEDGER_SPENT,
    WINDOW_SPENT,
    Statement,
    prepared_cursor,
    typed,
    windows,
)


def _fits(row: str) -> str:
    """Whether a hold fits a budget, over a ``pair`` row (``rules.fits``): its ``held`` is what
    the budget's counter row holds plus what the batch's items before it hold there."""
    return rules.fits(
        SQL,
        limit=f'{row}."limit"',
        spent=f"{row}.spent",
        held=f"{row}.held",
        amount=f"{row}.amount",
    )


# The counter rows of a tenant and of its key (if any), locked in the order every writer takes.
_COUNTERS = """
    SELECT id, api_key_id, held, spent_total,
           day_start, day_spent, week_start, week_spent, month_start, month_spent
    FROM accounts_budgetcounter
    WHERE tenant_id = %(tenant)s AND (api_key_id IS NULL OR api_key_id = %(key)s)
    ORDER BY api_key_id NULLS FIRST
    FOR UPDATE"""
COUNTERS_LOCK_SQL = typed(_COUNTERS)

HOLDS_SQL = typed(f"""
WITH item AS (  -- the batch, in arrival order (n)
    SELECT * FROM unnest(%(request_ids)s, %(tenants)s, %(keys)s, %(amounts)s, %(with_requests)s,
                         %(markets)s, %(bids)s, %(priority_caps)s, %(request_classes)s,
                         %(bid_sources)s, %(gateways)s)
        WITH ORDINALITY AS i(request_id, tenant, key, amount, with_request, market, bid,
                             priority_cap, request_class, bid_source, gateway, n)
),
counter AS (  -- the counter rows of the batch's tenants and keys, in (tenant, key) order
    SELECT c.id, c.tenant_id, c.api_key_id, c.held, c.spent_total, c.day_start, c.day_spent,
           c.week_start, c.week_spent, c.month_start, c.month_spent
    FROM accounts_budgetcounter c
    WHERE c.tenant_id IN (SELECT tenant FROM item)
      AND (c.api_key_id IS NULL OR c.api_key_id IN (SELECT key FROM item))
    ORDER BY c.tenant_id, c.api_key_id NULLS FIRST
    FOR UPDATE OF c
),
usage AS (  -- a window older than its row's (a clock behind): the ledger's sum, when summed
    SELECT b.id, b.tenant_id, b.api_key_id, b.period, b."limit", b.soft_alert_fraction, c.held,
           COALESCE({WINDOW_SPENT}, CASE WHEN %(summed)s THEN {LEDGER_SPENT} END) AS spent
    FROM accounts_budget b JOIN counter c
         ON c.tenant_id = b.tenant_id AND c.api_key_id IS NOT DISTINCT FROM b.api_key_id
),
pair AS MATERIALIZED (  -- each item and each budget that applies to it, with what the items
    -- before it in the batch hold there if each of them was placed
    SELECT i.n, u.id, u.api_key_id, u.period, u."limit", u.soft_alert_fraction, u.spent,
           i.amount, u.held + COALESCE(sum(i.amount) OVER (PARTITION BY u.id ORDER BY i.n
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS held
    FROM item i JOIN usage u
         ON u.tenant_id = i.tenant AND (u.api_key_id IS NULL OR u.api_key_id = i.key)
),
verdict AS MATERIALIZED (
    SELECT i.n, i.tenant,
           (SELECT count(*) FROM counter c
            WHERE c.tenant_id = i.tenant AND (c.api_key_id IS NULL OR c.api_key_id = i.key))
               = {COUNTERS_NEEDED.format(key="i.key")}
               AND NOT EXISTS (SELECT FROM pair p WHERE p.n = i.n AND p.spent IS NULL)
               AS counted,
           NOT EXISTS (SELECT FROM pair p WHERE p.n = i.n AND NOT {_fits("p")}) AS fits,
           EXISTS (SELECT FROM accounts_hold h WHERE h.request_id = i.request_id) AS replay
    FROM item i
),
first_odd AS (  -- each tenant's first item not placed as the others assumed (refused,
    -- declined or a replay): the tenant's items after it wait for the next statement
    SELECT tenant, min(n) AS n FROM verdict
    WHERE NOT (counted AND fits AND NOT replay)
    GROUP BY tenant
),
placed AS (
    INSERT INTO accounts_hold
        (request_id, tenant_id, api_key_id, amount, remaining, state, created_at)
    SELECT i.request_id, i.tenant, i.key, i.amount, i.amount, 'open', %(now)s
    FROM item i JOIN verdict v ON v.n = i.n LEFT JOIN first_odd f ON f.tenant = i.tenant
    WHERE f.n IS NULL OR i.n < f.n
    ORDER BY i.n
    ON CONFLICT (request_id) DO NOTHING
    RETURNING id, request_id
),
held AS (
    UPDATE accounts_budgetcounter c SET held = c.held + x.amount
    FROM (SELECT k.id, sum(i.amount) AS amount
          FROM counter k JOIN item i
               ON k.tenant_id = i.tenant AND (k.api_key_id IS NULL OR k.api_key_id = i.key)
          JOIN placed p ON p.request_id = i.request_id
          GROUP BY k.id) x
    WHERE c.id = x.id
),
request AS (
    INSERT INTO accounts_request (request_id, tenant_id, api_key_id, market_id, bid,
                                  priority_cap, request_class, bid_source, gateway, status,
                                  created_at)
    SELECT i.request_id, i.tenant, i.key, i.market, i.bid, i.priority_cap, i.request_class,
           i.bid_source, i.gateway, 'queued', %(now)s
    FROM item i JOIN placed p ON p.request_id = i.request_id
    WHERE i.with_request
    ORDER BY i.n
    ON CONFLICT (request_id) DO NOTHING
    RETURNING request_id
)
SELECT i.n, v.counted, v.fits, f.n IS NOT NULL AND i.n > f.n AS waits, p.id,
       i.request_id IN (SELECT request_id FROM request),
       pr.id, pr.api_key_id, pr.period, pr."limit", pr.soft_alert_fraction, pr.spent, pr.held,
       {_fits("pr")}
FROM item i JOIN verdict v ON v.n = i.n LEFT JOIN first_odd f ON f.tenant = i.tenant
     LEFT JOIN placed p ON p.request_id = i.request_id LEFT JOIN pair pr ON pr.n = i.n
ORDER BY i.n, pr.id
""")


@dataclass(frozen=True)
class BudgetRow:
    """One budget that applies to a hold, as the hold statement read it (dollars)."""

    budget_id: int
    api_key_id: int | None
    period: str
    limit: Decimal
    soft_alert_fraction: Decimal
    spent: Decimal  # in the window at the hold's time
    held: Decimal  # before this hold (the batch's earlier holds included)
    fits: bool  # whether the hold fits it


@dataclass(frozen=True)
class HoldAsk:
    """One hold of a batch: ``amount`` dollars for ``request_id`` of ``tenant_id`` (and its
    key), with the request's row when ``request`` is given (market, bid, priority_cap,
    request_class, bid_source, gateway)."""

    request_id: str
    tenant_id: int
    api_key_id: int | None
    amount: Decimal
    request: dict[str, Any] | None = None


@dataclass(frozen=True)
class HoldOutcome:
    """What the hold statement did with one ask: ``hold_id`` is set when it placed the hold.
    Else it wrote nothing for it: ``waits``, an earlier ask of its tenant in the batch was not
    placed as the others assumed (it is for the next statement); ``counted`` false, it declined
    (a counter row is missing, or a window is older than its row's and the ledger was not to be
    summed); ``fits`` false, a budget refused (``budgets``: which); both true, the request
    already has a hold."""

    hold_id: int | None
    counted: bool
    fits: bool
    budgets: list[BudgetRow]
    request_created: bool  # with a request: its row was created with the hold
    waits: bool = False


# A request's columns, and the statement's array parameter of each.
_REQUEST_COLUMNS = {
    "market": "markets",
    "bid": "bids",
    "priority_cap": "priority_caps",
    "request_class": "request_classes",
    "bid_source": "bid_sources",
    "gateway": "gateways",
}


def holds_place(*, asks: list[HoldAsk], now: datetime, summed: bool = False) -> list[HoldOutcome]:
    """Hold each ask's amount if every budget of its tenant and key fits it, as if one after
    another in the order of ``asks`` (distinct request ids), and record the requests of those
    that come with one, in one statement. A tenant's asks after its first one that is not
    placed (refused, declined, a replay) wait (``waits``). ``summed``: the spend of a window
    older than its counter row's is summed from the ledger; only with the counter rows locked
    already (:func:`counters_lock`). The outcomes, in the order of ``asks``."""
    return holds_statement(asks=asks, now=now, summed=summed).run()


def holds_statement(
    *, asks: list[HoldAsk], now: datetime, summed: bool = False
) -> Statement[list[HoldOutcome]]:
    """:func:`holds_place`'s statement, to run on any connection."""
    requests = [a.request or {} for a in asks]
    params = {
        "request_ids": [a.request_id for a in asks],
        "tenants": [a.tenant_id for a in asks],
        "keys": [a.api_key_id for a in asks],
        "amounts": [a.amount for a in asks],
        "with_requests": [a.request is not None for a in asks],
        **{array: [r.get(name) for r in requests] for name, array in _REQUEST_COLUMNS.items()},
        "now": now,
        "summed": summed,
        **windows(now),
    }
    return Statement(HOLDS_SQL, params, _hold_outcomes)


def _hold_outcomes(rows: list[tuple[Any, ...]]) -> list[HoldOutcome]:
    outcomes: list[HoldOutcome] = []
    for _, group in itertools.groupby(rows, key=lambda row: row[0]):
        items = list(group)
        counted, fits, waits, hold_id, request_created = items[0][1:6]
        outcomes.append(
            HoldOutcome(
                hold_id=hold_id,
                counted=counted,
                fits=fits,
                budgets=[BudgetRow(*row[6:]) for row in items if row[6] is not None],
                request_created=request_created,
                waits=waits,
            )
        )
    return outcomes


def counters_lock(*, tenant_id: int, api_key_id: int | None) -> None:
    """Lock the counter rows of a tenant and of its key (if any) until the transaction ends."""
    with prepared_cursor() as cursor:
        cursor.execute(COUNTERS_LOCK_SQL, {"tenant": tenant_id, "key": api_key_id})


_RELEASE_SQL_UNTYPED = f"""
WITH request AS (
    SELECT request_id, status FROM accounts_request WHERE request_id = %(request_id)s
    FOR UPDATE
),
hold AS (
    SELECT h.id, h.remaining, h.tenant_id, h.api_key_id,
           {COUNTERS_FOUND.format(tenant="h.tenant_id", key="h.api_key_id")}
               = {COUNTERS_NEEDED.format(key="h.api_key_id")} AS counted
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
       (SELECT count(*) FROM released), (SELECT tenant_id FROM hold), (SELECT api_key_id FROM hold)
"""
RELEASE_SQL = typed(_RELEASE_SQL_UNTYPED)


@dataclass(frozen=True)
class ReleaseOutcome:
    """What the release statement did; when ``counted`` is false it declined (wrote nothing):
    the open hold's tenant or key (``tenant_id``, ``api_key_id``) has no counter row."""

    counted: bool
    request_found: bool
    failed: bool  # the request was queued and is now failed
    released: bool  # its open hold was released
    tenant_id: int | None  # the open hold's, if any
    api_key_id: int | None


def hold_close(*, request_id: str, now: datetime, fail_request: bool) -> ReleaseOutcome:
    """Release the open hold of ``request_id`` (nothing charged) and, with ``fail_request``,
    mark the request failed if it was still queued."""
    params = {"request_id": request_id, "now": now, "fail": fail_request}
    with prepared_cursor() as cursor:
        cursor.execute(RELEASE_SQL, params)
        counted, found, failed, released, tenant_id, api_key_id = cursor.fetchone()
    return ReleaseOutcome(
        counted=counted,
        request_found=found > 0,
        failed=failed > 0,
        released=released > 0,
        tenant_id=tenant_id,
        api_key_id=api_key_id,
    )
