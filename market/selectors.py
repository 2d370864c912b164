"""Reads of the market app."""

from django.db.models import QuerySet

from market.models import Market, ReserveChange


def markets_active() -> QuerySet[Market]:
    """The markets currently open, by slug."""
    return Market.objects.filter(is_active=True).order_by("slug")


def market_by_slug(*, slug: str) -> Market:
    """The market with ``slug`` (Market.DoesNotExist when there is none)."""
    return Market.objects.get(slug=slug)


def reserve_changes_for_market(*, market: Market, limit: int = 50) -> QuerySet[ReserveChange]:
    """The latest reserve changes of ``market``, newest first."""
    return ReserveChange.objects.filter(market=market).select_related("changed_by")[:limit]
