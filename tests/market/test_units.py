"""The console's ``units`` template filters."""

from __future__ import annotations

from decimal import Decimal

from market.templatetags.units import rate


def test_amounts_are_shown_short_and_exact() -> None:
    assert rate(Decimal("0.002000000")) == "0.002"
    assert rate(Decimal("0E-9")) == "0"
    assert rate(Decimal("10.000000000")) == "10"
