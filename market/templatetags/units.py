"""``{% load units %}``: exact amounts shown short, for the live pages.

``{{ reserve|rate }}``: a $/s amount without trailing zeros (``0.002000000`` -> ``0.002``);
``{{ total|usd }}``: dollars with at least 2 decimals and no trailing zeros beyond them
(``12.345600000`` -> ``12.3456``, ``0E-9`` -> ``0.00``). Nothing is rounded.
"""

from decimal import Decimal

from django import template

register = template.Library()


def _plain(amount: Decimal, min_places: int) -> str:
    text = format(Decimal(amount), "f")
    if "." in text:
        whole, frac = text.split(".")
        frac = frac.rstrip("0").ljust(min_places, "0")
        return f"{whole}.{frac}" if frac else whole
    return f"{text}.{'0' * min_places}" if min_places else text


@register.filter
def rate(amount: Decimal | None) -> str:
    """A bid or reserve in $/s, exact, without trailing zeros."""
    return "" if amount is None else _plain(amount, 0)


@register.filter
def usd(amount: Decimal | None) -> str:
    """Dollars, exact, with at least two decimals."""
    return "" if amount is None else _plain(amount, 2)
