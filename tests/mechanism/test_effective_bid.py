"""The reserve rule, stated once (``mechanism.requests.effective_bid``; docs/mechanism.md,
"Payments"): a
bid below the reserve counts as 0; a bid at or above it counts in full. Each representation
(float $/s, whole ticks, exact Decimal) keeps its own type, so no figure changes."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accounts.money import ZERO
from mechanism import to_ticks
from mechanism.requests import effective_bid


@pytest.mark.parametrize(
    ("bid", "reserve", "expected"),
    [
        (0.002, 0.001, 0.002),  # above: the bid itself
        (0.001, 0.001, 0.001),  # at the reserve: counts (b >= r)
        (0.000999, 0.001, 0.0),  # just under: nothing
        (0.0, 0.0, 0.0),  # no reserve, no bid
        (0.5, 0.0, 0.5),  # no reserve: every bid counts
    ],
)
def test_floats(bid: float, reserve: float, expected: float) -> None:
    got = effective_bid(bid, reserve)
    assert got == expected and type(got) is float


def test_ticks_stay_whole() -> None:
    reserve = to_ticks(0.001)  # 1,000,000 ticks
    assert effective_bid(to_ticks(0.0015), reserve, zero=0) == 1_500_000
    assert effective_bid(reserve, reserve, zero=0) == 1_000_000
    under = effective_bid(reserve - 1, reserve, zero=0)
    assert under == 0 and type(under) is int


def test_decimals_keep_the_ledgers_zero() -> None:
    reserve = Decimal("0.001000000")
    assert effective_bid(Decimal("0.002000000"), reserve, zero=ZERO) == Decimal("0.002")
    assert effective_bid(Decimal("0.001000000"), reserve, zero=ZERO) == reserve
    under = effective_bid(Decimal("0.000999999"), reserve, zero=ZERO)
    assert under is ZERO and str(under) == str(ZERO)
