"""``{% load figures %}``: the one rule for figures shown to people (:mod:`accounts.figures`) as
the template filters the pages use: ``{{ amount|usd }}`` ("$0.00784"), ``{{ seconds|duration }}``
("28 d 9 h"), ``{{ factor|figure }}``. None or an empty value reads "—"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import template

from accounts import figures

register = template.Library()


def _shown(value: Any, rule: Callable[[Any], str]) -> str:
    return figures.NONE if value is None or value == "" else rule(value)


@register.filter
def usd(amount: Any) -> str:
    """Dollars (:func:`accounts.figures.usd`)."""
    return _shown(amount, figures.usd)


@register.filter
def duration(seconds: Any) -> str:
    """A duration (:func:`accounts.figures.duration`)."""
    return _shown(seconds, figures.duration)


@register.filter
def figure(value: Any) -> str:
    """A plain figure, three significant digits (:func:`accounts.figures.figure`)."""
    return _shown(value, figures.figure)
