"""The ledger store: every write that moves money or reserves it (DESIGN.md 6).

One interface, the reference's, with three writes, a two-phase transfer per request: open a
request with its hold (or place a hold alone), settle it (both its charges, the hold closed), or
close its hold unsettled (a release, or a failed request's); and a read of a request's posted
prices. :func:`ledger_store` chooses the implementation once per call site, by the database's
vendor:

- :class:`~accounts.ledger.orm.OrmLedger`, the reference: the ORM in a transaction, with the
  request's row, its hold's and its counters' locked in that order;
- :class:`~accounts.ledger.postgres.PostgresLedger` on PostgreSQL: each write is one statement
  (``accounts.ledger.statements``), and falls back to the reference in the few cases the
  statement declines (the first request of a tenant or key, a replayed hold, a clock behind the
  counters' window).

Both apply the same rules (``accounts.rules``: what a settlement may charge, what a
budget has left) and give typed results: :class:`Settled` says what a settlement did, with the
entries it wrote. The equivalence and money-invariant tests run both on PostgreSQL
(``STATEMENTS = False`` selects the reference there).
"""

from __future__ import annotations

from django.db import connection

from accounts.ledger.orm import OrmLedger
from accounts.ledger.postgres import PostgresLedger
from accounts.ledger.store import (
    BudgetExhausted,
    Outcome,
    PriorityCharge,
    Settled,
    Usage,
)

__all__ = [
    "BudgetExhausted",
    "Outcome",
    "PriorityCharge",
    "Settled",
    "Usage",
    "ledger_store",
]

# False: the reference ORM code on PostgreSQL too (the equivalence tests switch it).
STATEMENTS = True

_ORM = OrmLedger()
_POSTGRES = PostgresLedger()


def ledger_store() -> OrmLedger:  # PostgresLedger is an OrmLedger
    """The store for this database: the statements on PostgreSQL, else the reference."""
    return _POSTGRES if STATEMENTS and connection.vendor == "postgresql" else _ORM
