"""The ledger's writes on PostgreSQL, one statement each: holds, charges, a release.

Each function here does in one SQL statement (so in one round trip, atomic without BEGIN and
COMMIT) what a write of the ledger needs; the store (``accounts.ledger.postgres``) runs them. A
statement declines (it then writes nothing and says so) only when a counter row it needs is
missing (the first request of a tenant or key), or, for a hold, when a budget's window at the
hold's time is older than the one its counter row keeps (a clock behind it) and the ledger was
not to be summed for it: the store then creates the rows, or locks them first, and runs it again.

Locks, in the same order everywhere so that two statements never deadlock: the request's row,
then its hold's, then the counter rows of its tenant and of its key, in that order
(``ORDER BY api_key_id NULLS FIRST ... FOR UPDATE``); a batch of settlements takes its
requests' rows in request id order, then their holds', then the counter rows of its tenants
and keys in (tenant, key) order, then the autobidders' in id order; a batch of holds takes
the counter rows of its tenants and keys in (tenant, key) order. ``FOR UPDATE`` returns the
newest committed version of a row it waited for, so every check below reads values no one else
can change before the statement commits: concurrent holds cannot overspend a budget. The
counters' window rule is ``accounts.rules.window_counted``.

The modules: ``hold`` (a batch of holds placed as if one after another, a hold closed,
counter rows locked), ``charge`` (a batch of requests settled as if one after another, a
request's prices) and ``sql`` (the cursor, parameter types and SQL fragments they share).
The money rules in them are not written here: each is ``accounts.rules``'s, read as SQL. To
read the statements as PostgreSQL runs them: ``manage.py ledger_statements``.
"""

from __future__ import annotations

from .charge import (
    SETTLE_SQL,
    SettleAsk,
    SettleOutcome,
    request_prices,
    requests_settle,
    settle_statement,
)
from .hold import (
    HOLDS_SQL,
    RELEASE_SQL,
    BudgetRow,
    HoldAsk,
    HoldOutcome,
    counters_lock,
    hold_close,
    holds_place,
    holds_statement,
)
from .sql import Statement, model_loaded

__all__ = [
    "HOLDS_SQL",
    "RELEASE_SQL",
    "BudgetRow",
    "HoldAsk",
    "HoldOutcome",
    "counters_lock",
    "hold_close",
    "holds_place",
    "holds_statement",
    "model_loaded",
    "settle_statement",
    "Statement",
    "SETTLE_SQL",
    "request_prices",
    "requests_settle",
    "SettleAsk",
    "SettleOutcome",
]
