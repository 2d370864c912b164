"""Websocket consumers: operators watching markets, tenants watching their spend.

Each consumer authenticates the session's user (``AuthMiddlewareStack`` in ``config/asgi.py``),
joins its groups and has one handler per message type of the contract in ``market.payloads``;
a handler forwards the payload to the browser unchanged. A refused connection is closed during
the handshake (the browser sees it fail and retries later with backoff).

- ``/ws/markets/<slug>/`` (staff only): the market's book (a snapshot on connect, then diffs;
  ``{"type": "book.resync"}`` asks for a snapshot again), round results, engine status, and
  every tenant's spend line for the operators' table.
- ``/ws/tenants/<slug>/`` (the tenant's members, and staff): that tenant's spend ticks only.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from accounts.models import Tenant
from accounts.selectors import tenant_for_user
from market.live.book import book_snapshot
from market.live.engine_status import engine_status_last
from market.models import Market
from market.payloads import (
    OPERATORS_GROUP,
    BookDiff,
    BookSnapshot,
    EngineStatus,
    LayerMessage,
    RoundResult,
    SpendTick,
    TenantSpend,
    market_group,
    tenant_group,
)

FORBIDDEN = 4403  # close codes in the private range: not allowed, no such thing
NOT_FOUND = 4404


class _GroupConsumer(AsyncJsonWebsocketConsumer):
    """Joins ``self.groups_joined`` after the subclass's ``authorize`` says yes."""

    groups_joined: list[str]

    async def connect(self) -> None:
        self.groups_joined = []
        groups = await self.authorize()
        if groups is None:
            await self.close(code=FORBIDDEN)
            return
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        await self.accept()
        await self.on_accepted()

    async def authorize(self) -> list[str] | None:
        """The groups this user may join here, or None to refuse."""
        raise NotImplementedError

    async def on_accepted(self) -> None:
        """Send the current state, if there is one."""

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    def _user(self) -> Any:
        user = self.scope.get("user")
        return user if user is not None and user.is_authenticated and user.is_active else None


class MarketConsumer(_GroupConsumer):
    """An operator's console of one market."""

    slug: str

    async def authorize(self) -> list[str] | None:
        user = self._user()
        if user is None or not user.is_staff:
            return None
        self.slug = self.scope["url_route"]["kwargs"]["slug"]
        if not await database_sync_to_async(Market.objects.filter(slug=self.slug).exists)():
            return None
        return [market_group(self.slug), OPERATORS_GROUP]

    async def on_accepted(self) -> None:
        await self._send_snapshot()
        status = await database_sync_to_async(engine_status_last)(self.slug)
        if status is not None:
            await self.send_json(status)

    async def _send_snapshot(self) -> None:
        snapshot = await database_sync_to_async(book_snapshot)(self.slug)
        if snapshot is not None:
            await self.send_json(snapshot)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The only request a browser makes: a fresh snapshot after it missed a diff."""
        if isinstance(content, dict) and content.get("type") == "book.resync":
            await self._send_snapshot()

    async def book_snapshot(self, message: LayerMessage) -> None:
        payload: BookSnapshot = message["payload"]  # type: ignore[assignment]
        await self.send_json(payload)

    async def book_diff(self, message: LayerMessage) -> None:
        payload: BookDiff = message["payload"]  # type: ignore[assignment]
        await self.send_json(payload)

    async def round_result(self, message: LayerMessage) -> None:
        payload: RoundResult = message["payload"]  # type: ignore[assignment]
        await self.send_json(payload)

    async def engine_status(self, message: LayerMessage) -> None:
        payload: EngineStatus = message["payload"]  # type: ignore[assignment]
        await self.send_json(payload)

    async def tenant_spend(self, message: LayerMessage) -> None:
        payload: TenantSpend = message["payload"]  # type: ignore[assignment]
        await self.send_json(payload)


class TenantConsumer(_GroupConsumer):
    """A tenant's dashboard: only that tenant's spend ticks."""

    async def authorize(self) -> list[str] | None:
        user = self._user()
        if user is None:
            return None
        slug = self.scope["url_route"]["kwargs"]["slug"]

        def visible() -> bool:
            try:
                tenant_for_user(user=user, slug=slug)
            except Tenant.DoesNotExist:
                return False
            return True

        if not await database_sync_to_async(visible)():
            return None
        return [tenant_group(slug)]

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Read-only: messages from the browser are ignored."""

    async def spend_tick(self, message: LayerMessage) -> None:
        payload: SpendTick = message["payload"]  # type: ignore[assignment]
        await self.send_json(payload)
