"""``{% load money %}``: ``{{ amount|dollars }}``, an exact amount as fixed-point text;
``{{ amount|cents }}``, an amount rounded to the cent for people ("$0.33", "< $0.01")."""

from decimal import Decimal

from django import template

from accounts.money import cents_str, money_str

register = template.Library()


@register.filter
def dollars(amount: Decimal | None) -> str:
    """``Decimal("2E-9")`` -> ``"0.000000002"``; empty for None."""
    return "" if amount is None else money_str(Decimal(amount))


@register.filter
def cents(amount: Decimal | None) -> str:
    """``Decimal("0.331521622")`` -> ``"$0.33"`` (:func:`accounts.money.cents_str`); empty for
    None."""
    return "" if amount is None else cents_str(Decimal(amount))
