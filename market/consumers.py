"""Websocket consumers: browsers watching markets live."""

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from market.payloads import BookSnapshotMessage, order_book_group


class OrderBookConsumer(AsyncJsonWebsocketConsumer):
    """Streams a market's order-book snapshots. The public book is anonymous, so no login."""

    group_name: str

    async def connect(self) -> None:
        self.group_name = order_book_group(self.scope["url_route"]["kwargs"]["slug"])
        await self.channel_layer.group_add(self.group_name, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group_name"):
            await self.channel_layer.group_discard(self.group_name, self.channel_name)

    async def receive_json(self, content: object, **kwargs: object) -> None:
        """The book is read-only: messages from the browser are ignored."""

    async def book_snapshot(self, message: BookSnapshotMessage) -> None:
        """Forward one ``book.snapshot`` group message to the browser as JSON."""
        await self.send_json(message["snapshot"])
