"""Two readings of the same arithmetic, so that each money rule is written once.

A rule in ``accounts.rules`` is a function of an ``x`` (one of the two below) and its
operands. Called with :data:`SQL` and column or parameter expressions it returns the rule as a
PostgreSQL expression (the ledger's statements, ``accounts.ledger.statements``); called with
:data:`VALUES` and Decimal or datetime operands it computes the rule's result (the selectors,
the models, and the tests' reference ledger, which checks the statements). The two readings
agree by construction on everything but how they are written: an absent amount is ``None`` in
Python and ``NULL`` in SQL, and both readings treat it alike (ignored by ``least``, carried
through ``add``, ``sub`` and ``clip0``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from accounts.money import ZERO


class Values:
    """The rules computed: Decimal amounts, datetimes, None for an absent amount."""

    # Typed as the amounts they stand beside (Any here), so a rule reads either algebra alike.
    zero: Any = ZERO
    null: Any = None

    def add(self, a: Any, b: Any) -> Any:
        return None if a is None or b is None else a + b

    def sub(self, a: Any, b: Any) -> Any:
        return None if a is None or b is None else a - b

    def clip0(self, a: Any) -> Any:
        """``a``, or 0 when negative."""
        return None if a is None else max(a, ZERO)

    def least(self, *xs: Any) -> Any:
        """The least of the present ``xs`` (None when none is)."""
        present = [x for x in xs if x is not None]
        return min(present) if present else None

    def later(self, a: Any, b: Any) -> Any:
        return max(a, b)

    def coalesce(self, a: Any, b: Any) -> Any:
        return b if a is None else a

    def at_most(self, a: Any, b: Any) -> bool:
        return bool(a <= b)

    def by_window(self, kept: Any, start: Any, *, same: Any, newer: Any, older: Any) -> Any:
        """``same`` when a row's window (starting at ``kept``) is the window starting at
        ``start``, ``newer`` when the latter is newer, ``older`` when it is older."""
        if kept == start:
            return same
        return newer if kept < start else older

    def capped(self, asked: Any, limits: Sequence[tuple[Any, str]]) -> tuple[Any, str | None]:
        """``asked`` cut to the least of ``limits`` (None: no limit), and the name of the first
        limit it was cut to (None: not cut); nothing asked (None), nothing allowed."""
        if asked is None:
            return None, None
        amount = self.least(asked, *(limit for limit, _ in limits))
        if amount >= asked:
            return asked, None
        return amount, next(name for limit, name in limits if limit == amount)


class Sql:
    """The rules written as PostgreSQL expressions over columns and ``%(name)s`` parameters."""

    zero = "0"
    null = "NULL"

    def add(self, a: str, b: str) -> str:
        return f"({a} + {b})"

    def sub(self, a: str, b: str) -> str:
        return f"({a} - {b})"

    def clip0(self, a: str) -> str:
        # Not GREATEST(a, 0), which is 0 for a NULL a: an absent amount stays absent.
        return f"(CASE WHEN {a} < 0 THEN 0 ELSE {a} END)"

    def least(self, *xs: str) -> str:
        return f"LEAST({', '.join(xs)})"  # LEAST ignores NULLs, as Values.least ignores None

    def later(self, a: str, b: str) -> str:
        return f"GREATEST({a}, {b})"

    def coalesce(self, a: str, b: str) -> str:
        return f"COALESCE({a}, {b})"

    def at_most(self, a: str, b: str) -> str:
        return f"({a} <= {b})"

    def by_window(self, kept: str, start: str, *, same: str, newer: str, older: str) -> str:
        return (
            f"(CASE WHEN {kept} = {start} THEN {same} WHEN {kept} < {start} THEN {newer} "
            f"ELSE {older} END)"
        )

    def capped(self, asked: str, limits: Sequence[tuple[str, str]]) -> tuple[str, str]:
        amount = self.least(asked, *(limit for limit, _ in limits))
        names = " ".join(f"WHEN {amount} = {limit} THEN '{name}'" for limit, name in limits)
        return amount, f"(CASE WHEN {amount} >= {asked} THEN NULL {names} END)"


VALUES = Values()
SQL = Sql()
