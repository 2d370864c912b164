"""``{% load money %}``: ``{{ amount|cents }}``, an amount rounded to the cent for an invoice
("$0.33", "< $0.01"): what is due is paid in cents. Every other figure: ``{% load figures %}``."""

from decimal import Decimal

from django import template

from accounts.money import cents_str

register = template.Library()


@register.filter
def cents(amount: Decimal | None) -> str:
    """``Decimal("0.331521622")`` -> ``"$0.33"`` (:func:`accounts.money.cents_str`); empty for
    None."""
    return "" if amount is None else cents_str(Decimal(amount))
