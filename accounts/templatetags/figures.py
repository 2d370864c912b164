"""``{% load figures %}``: the one rule for figures shown to people (:mod:`accounts.figures`) as
template filters: ``{{ amount|usd }}`` ("$0.00784"), ``{{ bid|usd_per_s }}`` ("0.0126 $/s"),
``{{ seconds|duration }}`` ("28 d 9 h"), ``{{ factor|figure }}``, ``{{ n|count }}``,
``{{ share|percent }}``. None or an empty value reads "—"."""

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
def usd_per_s(rate: Any) -> str:
    """A rate in $/s (:func:`accounts.figures.usd_per_s`)."""
    return _shown(rate, figures.usd_per_s)


@register.filter
def duration(seconds: Any) -> str:
    """A duration (:func:`accounts.figures.duration`)."""
    return _shown(seconds, figures.duration)


@register.filter
def figure(value: Any) -> str:
    """A plain figure, three significant digits (:func:`accounts.figures.figure`)."""
    return _shown(value, figures.figure)


@register.filter
def count(value: Any) -> str:
    """A whole number, grouped (:func:`accounts.figures.count`)."""
    return _shown(value, figures.count)


@register.filter
def percent(share: Any) -> str:
    """A share of 1 in percent (:func:`accounts.figures.percent`)."""
    return _shown(share, figures.percent)
