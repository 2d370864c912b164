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

The modules: ``hold`` (a hold placed, a hold closed), ``charge`` (a request settled, a request's
prices) and ``sql`` (the cursor, parameter types and SQL fragments they share). The money rules
in them are not written here: each is ``accounts.rules``'s, read as SQL. To read the statements
as PostgreSQL runs them: ``manage.py ledger_statements``.
"""

from __future__ import annotations

from .charge import SETTLE_SQL, request_prices, request_settle
from .hold import (
    HOLD_AND_REQUEST_SQL,
    HOLD_SQL,
    RELEASE_SQL,
    BudgetRow,
    HoldOutcome,
    hold_close,
    hold_place,
)
from .sql import model_loaded

__all__ = [
    "HOLD_AND_REQUEST_SQL",
    "HOLD_SQL",
    "RELEASE_SQL",
    "BudgetRow",
    "HoldOutcome",
    "hold_close",
    "hold_place",
    "model_loaded",
    "SETTLE_SQL",
    "request_prices",
    "request_settle",
]
