"""The ledger store: every write that moves money or reserves it (DESIGN.md 6).

One interface, :class:`LedgerStore`, with four writes: open a request with its hold (or place a
hold alone), write a charge, close a hold (a release, or a failed request's), and read a
request's posted prices. :func:`ledger_store` chooses the implementation once per call site, by
the database's vendor:

- :class:`~accounts.ledger.orm.OrmLedger`, the reference: the ORM in a transaction, with the
  request's row, its hold's and its counters' locked in that order;
- :class:`~accounts.ledger.postgres.PostgresLedger` on PostgreSQL: each write is one statement
  (``accounts.ledger.statements``), and falls back to the reference in the few cases the
  statement declines (the first request of a tenant or key, a replayed hold, a clock behind the
  counters' window).

Both apply the same rules (``accounts.ledger.rules``: what a charge may be, what a budget has
left) and give typed results: :class:`Charged` says what a charge did, with its entry when one
was written. The equivalence and money-invariant tests run both on PostgreSQL
(``STATEMENTS = False`` selects the reference there).
"""

from __future__ import annotations

from django.db import connection

from accounts.ledger.orm import OrmLedger
from accounts.ledger.postgres import PostgresLedger
from accounts.ledger.store import BudgetExhausted, Charged, LedgerStore, Outcome

__all__ = ["BudgetExhausted", "Charged", "LedgerStore", "Outcome", "ledger_store"]

# False: the reference ORM code on PostgreSQL too (the equivalence tests switch it).
STATEMENTS = True

_ORM = OrmLedger()
_POSTGRES = PostgresLedger()


def ledger_store() -> OrmLedger:  # PostgresLedger is an OrmLedger; both are LedgerStores
    """The store for this database: the statements on PostgreSQL, else the reference."""
    return _POSTGRES if STATEMENTS and connection.vendor == "postgresql" else _ORM
