"""The ledger store: every write that moves money or reserves it.

One store, :class:`~accounts.ledger.postgres.PostgresLedger`, with three writes, a two-phase
transfer per request: open requests with their holds (many at once, as if one after another;
or place a hold alone), settle it (both its
charges, the hold closed; many requests at once, as if one after another), or close its hold
unsettled (a release, or a failed request's); and a read of a request's posted prices. Each
write is one PostgreSQL statement
(``accounts.ledger.statements``) that applies the money rules (``accounts.rules``: what a hold
must fit, what a settlement may charge, what a budget has left) read as SQL. The results are
typed: :class:`Settled` says what a settlement did, with the entries it wrote.

A batch of holds and a batch of settlements each also has its first statement as a
:class:`Statement` (``requests_open_first``, ``requests_settle_first``), which a caller may run
on a connection of its own (the gateway: on its event loop, with psycopg's async driver) and
read as the store would; the requests it did not decide are then written by the store itself.

The tests check the statements against a plain reference with the ORM
(``tests/accounts/reference_ledger.py``), which they put in the store's place.
"""

from __future__ import annotations

from accounts.ledger.postgres import PostgresLedger
from accounts.ledger.statements import Statement
from accounts.ledger.store import (
    BudgetExhausted,
    Open,
    Outcome,
    PriorityCharge,
    Settled,
    ToSettle,
    Usage,
)

__all__ = [
    "BudgetExhausted",
    "Open",
    "Outcome",
    "PriorityCharge",
    "Settled",
    "Statement",
    "ToSettle",
    "Usage",
    "ledger_store",
]

_LEDGER = PostgresLedger()


def ledger_store() -> PostgresLedger:
    """The ledger store."""
    return _LEDGER
