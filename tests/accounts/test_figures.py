"""The one rule for figures shown to people (accounts/figures.py), checked against a table written
by hand; tests/browser/test_figures_js.py feeds the same table to the browser's copy
(static/js/numbers.js), so the server's pages, the admin, messages and the live pages agree.

Each expected string is worked from the rule, not from the code: three significant digits,
rounded half up on the decimal value; money to the cent from $1 and to at most 9 places below;
durations in ms under 1 s, in s under a minute, then the two largest whole units, floored.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from accounts import figures

# (function, value, expected). Values are given as they reach the formatters: exact strings (the
# payloads' Decimal amounts), floats and ints (engine figures), None. Decimal values are tested
# below, apart, as the browser never receives a Decimal.
TABLE: list[tuple[str, object, str]] = [
    # The column "0.0000742 / 0.000147 / 0.01258": three significant digits each.
    ("usd_per_s", "0.0000742", "0.0000742 $/s"),
    ("usd_per_s", "0.000147", "0.000147 $/s"),
    ("usd_per_s", "0.012580", "0.0126 $/s"),  # 0.01258 -> 0.0126 (the 8 rounds the 5 up)
    ("usd_per_s", 0.002, "0.002 $/s"),  # no trailing zeros
    ("usd_per_s", "0.000000000", "0 $/s"),
    ("usd_per_s", 1234.5, "1,235 $/s"),  # the whole part is never rounded away
    ("usd_per_s", 0.00099996, "0.001 $/s"),  # 0.000999|96 -> 0.00100 -> "0.001"
    ("usd_per_s", 7.25e-7, "0.000000725 $/s"),  # JavaScript writes it "7.25e-7"
    ("usd_per_s", None, "—"),
    # Money: cents from $1 ("HELD 9.26"), 3 significant digits below ("0.007840" -> 0.00784).
    ("usd", "9.264900000", "$9.26"),
    ("usd", "0.007840000", "$0.00784"),
    ("usd", "0.0000742", "$0.0000742"),
    ("usd", "0.500000000", "$0.50"),  # at least the cents
    ("usd", "0.012000000", "$0.012"),  # no zeros past the cents
    ("usd", "0.125", "$0.125"),
    ("usd", "0.0012345", "$0.00123"),
    ("usd", "0.0012355", "$0.00124"),  # half up
    ("usd", "1234.565", "$1,234.57"),  # half up, grouped
    ("usd", "0.9996", "$1.00"),  # 0.9996 -> 1.00 at 3 digits
    ("usd", "0.000000002", "$0.000000002"),  # the ledger's nano-dollar
    ("usd", "0.0000000012", "$0.000000001"),  # at most 9 places
    ("usd", 2e-10, "< $0.000000001"),  # not zero, under half a nano-dollar
    ("usd", "0E-9", "$0.00"),
    ("usd", 0, "$0.00"),
    ("usd", -0.25, "-$0.25"),  # a welfare
    ("usd", 50, "$50.00"),
    ("usd", None, "—"),
    # Durations: "'0.1 ms' beside plain seconds", "resets in 2454360 s".
    ("duration", 0.0001, "0.1 ms"),
    ("duration", 0.0847, "84.7 ms"),
    ("duration", 0.5, "500 ms"),
    ("duration", 0.99996, "1 s"),  # 999.96 ms rounds to a second
    ("duration", 2.104, "2.1 s"),
    ("duration", 11.53, "11.5 s"),
    ("duration", 59.96, "1 min"),  # rounds to a minute
    ("duration", 125.9, "2 min 5 s"),  # from a minute on, floored
    ("duration", 3600, "1 h"),  # a zero second unit is left out
    ("duration", 7260, "2 h 1 min"),
    ("duration", 376200, "4 d 8 h"),  # 4 x 86400 + 8.5 x 3600
    ("duration", 2454360, "28 d 9 h"),  # 28 x 86400 = 2419200; 35160 s = 9 h 46 min
    ("duration", 0, "0 s"),
    ("duration", "-90", "-1 min 30 s"),
    ("duration", None, "—"),
    # Plain figures: the admin's exposure factor 0.0014224666666666666, a multiplier.
    ("figure", 0.0014224666666666666, "0.00142"),
    ("figure", 1.23456, "1.23"),
    ("figure", 0, "0"),
    ("count", 12345.5, "12,346"),
    ("count", 7, "7"),
    ("count", -0.4, "0"),  # no "-0"
    ("percent", 0.8234, "82.3%"),
    ("percent", 1, "100%"),
    ("percent", 0.000456, "0.0456%"),
    # As typed: every digit, no trailing zeros.
    ("exact", "0.002000000", "0.002"),
    ("exact", "0E-9", "0"),
    ("exact", "10.000000000", "10"),
    ("exact", "0.012345678", "0.012345678"),
]


@pytest.mark.parametrize(("name", "value", "expected"), TABLE)
def test_each_figure_reads_as_the_rule_says(name: str, value: object, expected: str) -> None:
    assert getattr(figures, name)(value) == expected


def test_a_decimal_reads_as_its_text() -> None:
    assert figures.usd(Decimal("0.007840000")) == "$0.00784"
    assert figures.usd_per_s(Decimal("0.012580000")) == "0.0126 $/s"
    assert figures.exact(Decimal("0.002000000")) == "0.002"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "NaN", "", "twelve", True])
def test_what_is_not_a_finite_number_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="number"):
        figures.usd(bad)  # type: ignore[arg-type]
