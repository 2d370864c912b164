"""``{% load money %}`` ``{{ amount|dollars }}``: an exact amount as fixed-point text."""

from decimal import Decimal

from django import template

from accounts.money import money_str

register = template.Library()


@register.filter
def dollars(amount: Decimal | None) -> str:
    """``Decimal("2E-9")`` -> ``"0.000000002"``; empty for None."""
    return "" if amount is None else money_str(Decimal(amount))
