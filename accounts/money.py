"""Money: exact dollars as ``Decimal`` with 9 decimal places (nano-dollars), never float.

The one rounding rule of the project lives here: :func:`money` quantizes to 9 decimal places,
half to even (banker's rounding), and is applied exactly once, at the moment a float from an
engine (a priority charge, in dollars) or a price x tokens product becomes a ledger amount.
Everything after that (sums, invoice totals, budgets) is exact ``Decimal`` arithmetic.

A float is converted with ``Decimal(float)``, which is exact (the binary value, all its digits),
so the only rounding is the quantization: ``money(0.1) == Decimal("0.100000000")``.

For people, not the ledger, :func:`cents` rounds an amount to the cent (half up) and
:func:`cents_str` writes it ("$0.33"): what an invoice shows as due. Nothing rounded to
cents is ever stored or summed. Every other figure shown to people: :mod:`accounts.figures`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation, localcontext
from typing import Protocol

from django.db import models

MONEY_PLACES = 9
MONEY_DIGITS = 20  # so amounts stay below 10**11 dollars
QUANTUM = Decimal(1).scaleb(-MONEY_PLACES)  # Decimal("1E-9"), one nano-dollar
MONEY_MAX = Decimal(10) ** (MONEY_DIGITS - MONEY_PLACES)  # exclusive
ZERO = Decimal("0").quantize(QUANTUM)
# An amount written as text: ASCII digits, optionally a sign, a fraction and an exponent.
# Decimal() alone also reads "1_0" (as 10), Arabic-Indic, fullwidth and other scripts' digits.
DECIMAL_TEXT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def decimal_text(value: str) -> Decimal:
    """The number ``value`` writes in :data:`DECIMAL_TEXT` (ASCII spaces around it dropped);
    ValueError for anything else ("1_0", "١", "NaN", "Infinity", "0x10", "")."""
    stripped = value.strip(" \t\r\n")
    if stripped.lstrip("+-").lower() in ("nan", "snan", "inf", "infinity"):
        raise ValueError(f"amount is not finite: {value!r}")
    if not DECIMAL_TEXT.fullmatch(stripped):
        raise ValueError(f"not an amount of money: {value!r}")
    return Decimal(stripped)


def _as_decimal(value: Decimal | float | int | str) -> Decimal:
    if isinstance(value, bool):
        raise ValueError(f"not an amount of money: {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"amount is not finite: {value!r}")
        result = Decimal(value)
    elif isinstance(value, str):
        result = decimal_text(value)
    elif isinstance(value, Decimal | int):
        try:
            result = Decimal(value)
        except InvalidOperation as exc:
            raise ValueError(f"not an amount of money: {value!r}") from exc
        if not result.is_finite():
            raise ValueError(f"amount is not finite: {value!r}")
    else:
        raise ValueError(f"not an amount of money: {value!r}")
    if result.copy_abs() >= MONEY_MAX:  # before quantizing: "1e30" would not fit its precision
        raise ValueError(f"amount is too large: {value!r}")
    return result


def _checked_range(amount: Decimal, original: object) -> Decimal:
    if amount < 0:
        raise ValueError(f"amount is negative: {original!r}")
    if amount >= MONEY_MAX:
        raise ValueError(f"amount is too large: {original!r}")
    return amount


def money(value: Decimal | float | int | str) -> Decimal:
    """Dollars as a ledger amount: quantized to 9 places, half to even. THE rounding rule.

    ValueError for NaN, infinities, negative amounts, amounts of 10**11 dollars or more, and
    anything that is not a number (bools included).
    """
    amount = _as_decimal(value)
    with localcontext() as ctx:
        ctx.prec = 60  # room for a float's full binary expansion; quantize does the rounding
        quantized = amount.quantize(QUANTUM, rounding=ROUND_HALF_EVEN)
    return _checked_range(quantized, value) + ZERO  # +ZERO: "-0E-9" becomes "0E-9"


def money_exact(value: Decimal | int | str) -> Decimal:
    """An amount typed by a person (a reserve, a limit, a price): no rounding at all.

    ValueError when it is not finite, negative, too large, a float (say it as a string), or
    has more than 9 decimal places.
    """
    if isinstance(value, float):
        raise ValueError(f"give amounts as strings or Decimals, not floats: {value!r}")
    amount = _as_decimal(value)
    if amount != amount.quantize(QUANTUM, rounding=ROUND_HALF_EVEN):
        raise ValueError(f"amount has more than {MONEY_PLACES} decimal places: {value!r}")
    return _checked_range(amount.quantize(QUANTUM), value) + ZERO


def per_million(*, tokens: int, price_per_million: Decimal) -> Decimal:
    """Exact dollars for ``tokens`` at ``price_per_million`` dollars per million (not rounded)."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"token count must be a non-negative int: {tokens!r}")
    with localcontext() as ctx:
        ctx.prec = 60
        return (price_per_million * tokens).scaleb(-6)


def money_str(amount: Decimal) -> str:
    """An amount as fixed-point text with its 9 places ("0.000000002", never "2E-9")."""
    return format(amount.quantize(QUANTUM), "f")


CENT = Decimal("0.01")


def cents(amount: Decimal) -> Decimal:
    """Dollars rounded to the cent, half up: an amount for a person to read or pay (an invoice's
    total due), never one to store or add up (sums are of the exact amounts).

    Half up, not the ledger's half to even: half to even avoids a drift when many rounded
    amounts are added, which never happens to a display amount (each is rounded once, from an
    exact sum), and half up is the commercial rule a customer checking a bill by hand expects
    ($0.125 -> $0.13). An exact half cent is rare anyway: amounts have 9 places.
    """
    return Decimal(amount).quantize(CENT, rounding=ROUND_HALF_UP)


def cents_str(amount: Decimal) -> str:
    """An amount as a person reads it: rounded by :func:`cents`, "$1,234.57".

    A non-zero amount that rounds to $0.00 reads "< $0.01", so that a small charge is never
    shown as none; zero reads "$0.00". Amounts are not negative (the ledger refuses them).
    """
    amount = Decimal(amount)
    rounded = cents(amount)
    if rounded == 0 and amount != 0:
        return "< $0.01"
    return f"${rounded:,.2f}"


def MoneyField(**kwargs: object) -> models.DecimalField:  # noqa: N802 (reads like a field class)
    """A money column: ``DecimalField(max_digits=20, decimal_places=9)``, dollars."""
    return models.DecimalField(max_digits=MONEY_DIGITS, decimal_places=MONEY_PLACES, **kwargs)


class PostedPrices(Protocol):
    """A market's posted token prices, dollars per million tokens, as settlement reads them
    (``market.models.Market`` is one; accounts does not import it)."""

    pk: int | None
    price_input_per_mtok: Decimal
    price_cached_input_per_mtok: Decimal
    price_output_per_mtok: Decimal


def prices_of(market: PostedPrices) -> tuple[Decimal, Decimal, Decimal]:
    """A market's posted prices (input, cached input, output, dollars per million tokens): what
    a token charge was priced from, to compare with the market's prices when it is written."""
    return (
        market.price_input_per_mtok,
        market.price_cached_input_per_mtok,
        market.price_output_per_mtok,
    )


@dataclass(frozen=True, slots=True)
class Prices:
    """Posted prices read without the market's row (the PostgreSQL fast path's one query)."""

    price_input_per_mtok: Decimal
    price_cached_input_per_mtok: Decimal
    price_output_per_mtok: Decimal
    pk: int | None = None
