"""The one rounding rule (``accounts.money.money``) and exact token prices.

Expected values are worked out by hand in the comments.
"""

from decimal import Decimal

import pytest

from accounts.money import cents, cents_str, money, money_exact, money_str, per_million


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # Exact ties at the 10th decimal go to the even 9th digit.
        (Decimal("0.0000000005"), "0.000000000"),
        (Decimal("0.0000000015"), "0.000000002"),
        (Decimal("0.0000000025"), "0.000000002"),
        (Decimal("0.0000000035"), "0.000000004"),
        # Not a tie: 0.00000000250001 is above the half, so up.
        (Decimal("0.00000000250001"), "0.000000003"),
        # 1.2345678904999 is below the half at the 10th place: down.
        (Decimal("1.2345678904999"), "1.234567890"),
        # Integers and strings are exact already.
        (7, "7.000000000"),
        ("12.5", "12.500000000"),
        # A float is taken at its exact binary value: 0.1 is 0.1000000000000000055..., so it
        # becomes 0.100000000; 0.1 + 0.2 is 0.3000000000000000444..., so 0.300000000.
        (0.1, "0.100000000"),
        (0.1 + 0.2, "0.300000000"),
        # 2**-30 = 0.000000000931322574615478515625 exactly: 9 places, the 10th digit is 3: down.
        (2.0**-30, "0.000000001"),
        (0.0, "0.000000000"),
    ],
)
def test_money_rounds_half_even_to_nine_places(value, expected) -> None:
    result = money(value)
    assert isinstance(result, Decimal)
    assert result == Decimal(expected)
    assert money_str(result) == expected


def test_two_to_the_minus_thirty_detail() -> None:
    # 0.000000000931... has its 9th decimal 0 and 10th 9: rounds up to one nano-dollar.
    assert money(2.0**-30) == Decimal("0.000000001")
    # 2**-31 = 0.000000000465661287...: below half a nano-dollar, rounds to 0.
    assert money(2.0**-31) == Decimal("0")


@pytest.mark.parametrize(
    "bad",
    [float("nan"), float("inf"), float("-inf"), -0.01, Decimal("-1"), Decimal("NaN"), True, "x"],
)
def test_money_rejects_non_finite_negative_and_non_numbers(bad) -> None:
    with pytest.raises(ValueError):
        money(bad)


def test_money_rejects_amounts_that_do_not_fit_the_column() -> None:
    # DecimalField(max_digits=20, decimal_places=9): at most 11 digits before the point.
    assert money(Decimal("99999999999.999999999")) == Decimal("99999999999.999999999")
    with pytest.raises(ValueError):
        money(Decimal("100000000000"))


def test_money_exact_refuses_to_round() -> None:
    assert money_exact("0.000000001") == Decimal("0.000000001")
    assert money_str(money_exact(3)) == "3.000000000"
    with pytest.raises(ValueError, match="decimal places"):
        money_exact("0.0000000001")
    with pytest.raises(ValueError, match="floats"):
        money_exact(0.5)
    for bad in ("-1", "inf", "NaN", "abc"):
        with pytest.raises(ValueError):
            money_exact(bad)


def test_per_million_is_exact() -> None:
    # 3 tokens at $1.234567891 per million: 3.703703673 / 10**6, every digit kept.
    assert per_million(tokens=3, price_per_million=Decimal("1.234567891")) == Decimal(
        "0.000003703703673"
    )
    # Rounded once by the rule: the 10th decimal is 7, so 0.000003704.
    assert money(per_million(tokens=3, price_per_million=Decimal("1.234567891"))) == Decimal(
        "0.000003704"
    )
    with pytest.raises(ValueError):
        per_million(tokens=-1, price_per_million=Decimal(1))
    with pytest.raises(ValueError):
        per_million(tokens=1.5, price_per_million=Decimal(1))


def test_money_str_is_fixed_point() -> None:
    assert money_str(Decimal("2E-9")) == "0.000000002"
    assert money_str(Decimal("12")) == "12.000000000"
    assert money_str(Decimal("0")) == "0.000000000"


@pytest.mark.parametrize(
    ("amount", "rounded", "shown"),
    [
        # Exact half cents go up (the commercial rule), where the ledger's half-even rule would
        # give 0.12 and 0.42.
        ("0.125000000", "0.13", "$0.13"),
        ("0.425000000", "0.43", "$0.43"),
        # Just below the half: down.
        ("0.124999999", "0.12", "$0.12"),
        # Under half a cent but not nothing: rounds to 0, shown as less than a cent.
        ("0.004999999", "0.00", "< $0.01"),
        ("0.000000001", "0.00", "< $0.01"),
        # Half a cent: a cent.
        ("0.005000000", "0.01", "$0.01"),
        ("0.000000000", "0.00", "$0.00"),
        # Thousands separated; 1234.565 is a tie: up.
        ("1234.565000000", "1234.57", "$1,234.57"),
    ],
)
def test_cents_rounds_half_up_for_people(amount, rounded, shown) -> None:
    assert cents(Decimal(amount)) == Decimal(rounded)
    assert cents_str(Decimal(amount)) == shown
