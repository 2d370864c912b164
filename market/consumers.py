"""Websocket consumers: operators watching markets, tenants watching their spend.

Each consumer authenticates the session's user (``AuthMiddlewareStack`` in ``config/asgi.py``),
joins its groups and has one handler per message type of the contract in ``market.payloads``;
a handler forwards the payload to the browser unchanged. A refused connection is closed during
the handshake (the browser sees it fail and retries later with backoff).

Access is checked again while a socket is open, so that one stops receiving as soon as its user
may no longer see what it shows: at once when the user's access may have changed (an
``access.changed`` message to the user's group, sent by ``market.live.access`` when a membership
or the user changes or the user logs out), and every ``LIVE_ACCESS_RECHECK_S`` seconds for
changes that send no signal. The re-check is the connect-time check again, from the socket's
session as it is now: the session still exists and is still this user's (no logout, no password
change since), the user is active, and still a member (or staff, for the market socket). When it
fails the socket leaves its groups, sends nothing more and is closed with 4403.

- ``/ws/markets/<slug>/`` (staff only): the market's book (a snapshot on connect, then diffs;
  ``{"type": "book.resync"}`` asks for a snapshot again), round results, engine status, and
  every tenant's spend line for the operators' table.
- ``/ws/tenants/<slug>/`` (the tenant's members, and staff): that tenant's spend ticks only.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import import_module
from typing import Any

from channels.auth import get_user
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from accounts.models import Tenant
from accounts.selectors import tenant_for_user
from market.live.book import book_snapshot
from market.live.engine_status import engine_status_last
from market.models import Market
from market.payloads import OPERATORS_GROUP, LayerMessage, market_group, tenant_group, user_group

logger = logging.getLogger(__name__)

FORBIDDEN = 4403  # close codes in the private range: not allowed, no such thing
NOT_FOUND = 4404
CHECK_FAILED = 1011  # the re-check itself failed (the database away): the browser reconnects


class _GroupConsumer(AsyncJsonWebsocketConsumer):
    """Joins the groups the subclass's ``groups_for`` allows, and its user's own group, and
    keeps checking that access while open (see the module's docstring)."""

    groups_joined: list[str]
    user_id: Any = None
    revoked = False  # access is gone: nothing more is sent
    _rechecks: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        self.groups_joined = []
        user = self._user()
        groups = await database_sync_to_async(self.groups_for)(user) if user else None
        if groups is None:
            await self.close(code=FORBIDDEN)
            return
        self.user_id = user.pk
        for group in [*groups, user_group(user.pk)]:
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        await self.accept()
        self._rechecks = asyncio.create_task(self._recheck_every(settings.LIVE_ACCESS_RECHECK_S))
        await self.on_accepted()

    def groups_for(self, user: Any) -> list[str] | None:
        """The groups ``user`` (active, logged in) may join here now, or None to refuse;
        synchronous (it runs on a database thread)."""
        raise NotImplementedError

    async def on_accepted(self) -> None:
        """Send the current state, if there is one."""

    async def disconnect(self, code: int) -> None:
        if self._rechecks is not None:
            self._rechecks.cancel()
        await self._groups_left()

    async def receive(self, text_data=None, bytes_data=None, **kwargs: Any) -> None:  # type: ignore[override]
        """A frame from the browser: JSON text goes to ``receive_json``; anything else (not
        JSON, binary) is dropped. A stray frame is no reason to close the live feed, nor to log
        a traceback."""
        if text_data is None:
            return
        try:
            content = await self.decode_json(text_data)
        except (ValueError, RecursionError):
            return
        await self.receive_json(content, **kwargs)

    async def send(self, text_data=None, bytes_data=None, close=False) -> None:  # type: ignore[override]
        if self.revoked:
            return  # a message that was on its way when access ended
        await super().send(text_data=text_data, bytes_data=bytes_data, close=close)

    async def forward(self, message: LayerMessage) -> None:
        """A payload of the contract (``market.payloads``), to the browser unchanged."""
        await self.send_json(message["payload"])

    async def access_changed(self, message: LayerMessage) -> None:
        """The user's access may have changed: check it now (nothing goes to the browser)."""
        await self._recheck()

    def _user(self) -> Any:
        user = self.scope.get("user")
        return user if user is not None and user.is_authenticated and user.is_active else None

    async def _still_allowed(self) -> bool:
        """The connect-time check again, with the session and the user as they are now."""
        session = self.scope.get("session")
        key = session.session_key if session is not None else None
        if key is None:
            return False
        store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=key)
        user = await get_user({"session": store})  # Anonymous once logged out or invalidated
        if not (user.is_authenticated and user.is_active and user.pk == self.user_id):
            return False
        return await database_sync_to_async(self.groups_for)(user) is not None

    async def _recheck(self) -> None:
        if self.revoked:
            return
        try:
            allowed = await self._still_allowed()
        except Exception:
            logger.warning(
                "live: the access re-check of %s failed", self.scope["path"], exc_info=True
            )
            await self._revoke(code=CHECK_FAILED)
            return
        if not allowed:
            await self._revoke(code=FORBIDDEN)

    async def _recheck_every(self, interval_s: float) -> None:
        while not self.revoked:
            await asyncio.sleep(interval_s)
            await self._recheck()

    async def _revoke(self, *, code: int) -> None:
        if self.revoked:
            return
        self.revoked = True
        await self._groups_left()
        await self.close(code=code)

    async def _groups_left(self) -> None:
        groups, self.groups_joined = getattr(self, "groups_joined", []), []
        for group in groups:
            await self.channel_layer.group_discard(group, self.channel_name)


class MarketConsumer(_GroupConsumer):
    """An operator's console of one market."""

    slug: str

    def groups_for(self, user: Any) -> list[str] | None:
        if not (user.is_active and user.is_staff):
            return None
        self.slug = self.scope["url_route"]["kwargs"]["slug"]
        if not Market.objects.filter(slug=self.slug).exists():
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

    # One handler per message type of the contract (``market.payloads``): BookSnapshot,
    # BookDiff, RoundResult, EngineStatus, TenantSpend, each forwarded as it is.
    book_snapshot = book_diff = round_result = engine_status = tenant_spend = _GroupConsumer.forward


class TenantConsumer(_GroupConsumer):
    """A tenant's dashboard: only that tenant's spend ticks."""

    def groups_for(self, user: Any) -> list[str] | None:
        slug = self.scope["url_route"]["kwargs"]["slug"]
        try:
            tenant_for_user(user=user, slug=slug)  # active, and a member or staff
        except Tenant.DoesNotExist:
            return None
        return [tenant_group(slug)]

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Read-only: messages from the browser are ignored."""

    spend_tick = _GroupConsumer.forward  # SpendTick


class UnknownPath(AsyncJsonWebsocketConsumer):
    """Any other websocket path: refused (the handshake's answer is 403), not a 500 and a
    traceback for each probe."""

    async def connect(self) -> None:
        await self.close(code=NOT_FOUND)
