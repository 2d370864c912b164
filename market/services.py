"""Writes and side effects of the market app."""

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from accounts.money import money_exact
from market.models import Market, ReserveChange
from market.payloads import OrderBookSnapshot, book_snapshot_message, order_book_group


def order_book_publish(*, snapshot: OrderBookSnapshot) -> None:
    """Send ``snapshot`` to everyone watching its market's book (from synchronous code)."""
    layer = get_channel_layer()
    async_to_sync(layer.group_send)(
        order_book_group(snapshot["market"]), book_snapshot_message(snapshot)
    )


def market_reserve_set(
    *,
    market: Market,
    reserve: Decimal | str | int,
    user: AbstractBaseUser | None,
    now: datetime | None = None,
) -> ReserveChange | None:
    """Set ``market``'s reserve price (dollars per second of waiting) and audit the change.

    ``reserve`` must be finite, >= 0 and have at most 9 decimal places (ValueError otherwise; a
    float is refused too: say it as a string). The audit row and the new value commit together,
    with the market row locked so concurrent changes record the true old value. Setting the
    value it already has writes nothing and returns None.
    """
    new = money_exact(reserve)
    with transaction.atomic():
        locked = Market.objects.select_for_update().get(pk=market.pk)
        if locked.reserve == new:
            market.reserve = new
            return None
        change = ReserveChange.objects.create(
            market=locked,
            changed_by=user if user is not None and user.is_authenticated else None,
            old=locked.reserve,
            new=new,
            at=now or timezone.now(),
        )
        Market.objects.filter(pk=market.pk).update(reserve=new, updated_at=timezone.now())
    market.reserve = new
    return change


@dataclass(frozen=True)
class MarketSpec:
    """What a market is created with (prices in dollars per million tokens, as strings)."""

    slug: str
    name: str
    served_model: str
    price_input_per_mtok: str
    price_cached_input_per_mtok: str
    price_output_per_mtok: str
    reserve: str


DEMO_MARKET = MarketSpec(
    slug="demo-llm",
    name="Demo LLM",
    served_model="demo/tiny-llm",
    price_input_per_mtok="0.150000000",
    price_cached_input_per_mtok="0.075000000",
    price_output_per_mtok="0.600000000",
    reserve="0.001000000",
)


def market_ensure(*, spec: MarketSpec) -> Market:
    """The market with ``spec.slug``, created from ``spec`` if missing (an existing one is kept:
    operators may have moved its prices or reserve since)."""
    market, _ = Market.objects.get_or_create(
        slug=spec.slug,
        defaults={
            "name": spec.name,
            "served_model": spec.served_model,
            "price_input_per_mtok": money_exact(spec.price_input_per_mtok),
            "price_cached_input_per_mtok": money_exact(spec.price_cached_input_per_mtok),
            "price_output_per_mtok": money_exact(spec.price_output_per_mtok),
            "reserve": money_exact(spec.reserve),
        },
    )
    return market


def market_demo_seed() -> Market:
    """The demo market ``make run`` starts with. Idempotent."""
    return market_ensure(spec=DEMO_MARKET)
