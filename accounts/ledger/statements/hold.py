"""A hold placed and a hold closed, one statement each (the package's docstring says how they
lock and when they decline), and the lock of a tenant's and key's counter rows."""

from __future__ import annotations

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
    prepared_cursor,
    typed,
    windows,
)

# Whether the hold fits a budget's usage row (``rules.fits``).
_FITS = rules.fits(SQL, limit='"limit"', spent="spent", held="held", amount="%(amount)s")

# The counter rows of a tenant and of its key (if any), locked in the order every writer takes.
_COUNTERS = """
    SELECT id, api_key_id, held, spent_total,
           day_start, day_spent, week_start, week_spent, month_start, month_spent
    FROM accounts_budgetcounter
    WHERE tenant_id = %(tenant)s AND (api_key_id IS NULL OR api_key_id = %(key)s)
    ORDER BY api_key_id NULLS FIRST
    FOR UPDATE"""
COUNTERS_LOCK_SQL = typed(_COUNTERS)

_HOLD_SQL = f"""
WITH counter AS ({_COUNTERS}
),
usage AS (  -- a window older than its row's (a clock behind): the ledger's sum, when summed
    SELECT b.id, b.api_key_id, b.period, b."limit", b.soft_alert_fraction, c.held,
           COALESCE({WINDOW_SPENT}, CASE WHEN %(summed)s THEN {LEDGER_SPENT} END) AS spent
    FROM accounts_budget b JOIN counter c ON c.api_key_id IS NOT DISTINCT FROM b.api_key_id
    WHERE b.tenant_id = %(tenant)s AND (b.api_key_id IS NULL OR b.api_key_id = %(key)s)
),
verdict AS (
    SELECT (SELECT count(*) FROM counter) = {COUNTERS_NEEDED.format(key="%(key)s")}
               AND NOT EXISTS (SELECT FROM usage WHERE spent IS NULL) AS counted,
           NOT EXISTS (SELECT FROM usage WHERE NOT {_FITS}) AS fits
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
       u.id, u.api_key_id, u.period, u."limit", u.soft_alert_fraction, u.spent, u.held,
       {_FITS}
FROM verdict v LEFT JOIN usage u ON true
ORDER BY u.id
"""

_REQUEST_INSERT = """,
request AS (
    INSERT INTO accounts_request (request_id, tenant_id, api_key_id, market_id, bid,
                                  priority_cap, request_class, bid_source, gateway, status,
                                  created_at)
    SELECT %(request_id)s, %(tenant)s, %(key)s, %(market)s, %(bid)s,
           %(priority_cap)s, %(request_class)s, %(bid_source)s, %(gateway)s, 'queued', %(now)s
    WHERE EXISTS (SELECT FROM placed)
    ON CONFLICT (request_id) DO NOTHING
    RETURNING 1
)"""

HOLD_SQL = typed(_HOLD_SQL.format(request="", request_inserted="NULL"))
HOLD_AND_REQUEST_SQL = typed(
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
    fits: bool  # whether the hold fits it


@dataclass(frozen=True)
class HoldOutcome:
    """What the hold statement did: ``hold_id`` is set when it placed the hold. Else it wrote
    nothing: ``counted`` false, it declined (a counter row is missing, or a window is older than
    its row's and the ledger was not to be summed); ``fits`` false, a budget refused
    (``budgets``: which); both true, the request already has a hold."""

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
    summed: bool = False,
) -> HoldOutcome:
    """Hold ``amount`` dollars for ``request_id`` if every budget of the tenant and the key
    fits it, and (with ``request``: market, bid, priority_cap, request_class, bid_source,
    gateway) record the request. ``summed``: the spend of a window older than its counter
    row's is summed from the ledger; only with the counter rows locked already
    (:func:`counters_lock`).
    """
    params = {
        "tenant": tenant_id,
        "key": api_key_id,
        "request_id": request_id,
        "amount": amount,
        "now": now,
        "summed": summed,
        **windows(now),
        **(request or {}),
    }
    with prepared_cursor() as cursor:
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
