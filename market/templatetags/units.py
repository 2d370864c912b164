"""``{% load units %}``: ``{{ reserve|rate }}``, an amount in $/s as the operator typed it, all
its digits and no trailing zeros (``0.002000000`` -> ``0.002``): reserves and ceilings being
confirmed or audited (:func:`accounts.figures.exact`). Measured figures use ``{% load figures %}``.
"""

from decimal import Decimal

from django import template

from accounts.figures import exact

register = template.Library()


@register.filter
def rate(amount: Decimal | None) -> str:
    """A reserve or ceiling in $/s, exact, without trailing zeros; empty for None."""
    return "" if amount is None else exact(amount)
