"""The order-book websocket: group messages of type ``book.snapshot`` reach the browser."""

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from channels_redis.core import RedisChannelLayer

from config.asgi import application
from market.payloads import OrderBookSnapshot, book_snapshot_message, order_book_group
from market.services import order_book_publish

ORIGIN = (b"origin", b"http://localhost")


def snapshot_for(slug: str, round_: int) -> OrderBookSnapshot:
    return {
        "market": slug,
        "round": round_,
        "at": 1_700_000_000.25,
        "reserve": 0.01,
        "levels": [
            {"subtree": "a1", "requests": 3, "total_bid": 0.75, "work_tokens": 1200},
            {"subtree": "b7", "requests": 1, "total_bid": 0.1, "work_tokens": 64},
        ],
    }


async def connect(slug: str) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, f"/ws/markets/{slug}/book/", headers=[ORIGIN])
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    return communicator


@pytest.mark.redis
@pytest.mark.asyncio
async def test_round_trip_through_the_redis_channel_layer(unique_slug: str) -> None:
    layer = get_channel_layer()
    assert isinstance(layer, RedisChannelLayer)
    communicator = await connect(unique_slug)
    try:
        first = snapshot_for(unique_slug, 1)
        await layer.group_send(order_book_group(unique_slug), book_snapshot_message(first))
        assert await communicator.receive_json_from(timeout=5) == first
        # The producer-side service, called from synchronous code as a Celery task would.
        second = snapshot_for(unique_slug, 2)
        await sync_to_async(order_book_publish)(snapshot=second)
        assert await communicator.receive_json_from(timeout=5) == second
    finally:
        await communicator.disconnect()


@pytest.mark.asyncio
async def test_round_trip_through_the_in_memory_layer(settings, unique_slug: str) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    communicator = await connect(unique_slug)
    try:
        snapshot = snapshot_for(unique_slug, 7)
        await get_channel_layer().group_send(
            order_book_group(unique_slug), book_snapshot_message(snapshot)
        )
        assert await communicator.receive_json_from(timeout=5) == snapshot
    finally:
        await communicator.disconnect()


@pytest.mark.asyncio
async def test_other_markets_books_do_not_arrive(settings, unique_slug: str) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    communicator = await connect(unique_slug)
    try:
        other = f"{unique_slug}-other"
        await get_channel_layer().group_send(
            order_book_group(other), book_snapshot_message(snapshot_for(other, 1))
        )
        assert await communicator.receive_nothing(timeout=0.2)
    finally:
        await communicator.disconnect()


@pytest.mark.asyncio
async def test_foreign_origin_is_refused(unique_slug: str) -> None:
    communicator = WebsocketCommunicator(
        application,
        f"/ws/markets/{unique_slug}/book/",
        headers=[(b"origin", b"http://evil.example")],
    )
    connected, _ = await communicator.connect(timeout=5)
    assert not connected
