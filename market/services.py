"""Writes and side effects of the market app."""

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from market.payloads import OrderBookSnapshot, book_snapshot_message, order_book_group


def order_book_publish(*, snapshot: OrderBookSnapshot) -> None:
    """Send ``snapshot`` to everyone watching its market's book (from synchronous code)."""
    layer = get_channel_layer()
    async_to_sync(layer.group_send)(
        order_book_group(snapshot["market"]), book_snapshot_message(snapshot)
    )
