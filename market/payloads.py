"""Websocket payloads, shared by the producers (services, Celery tasks) and the consumers.

A channel-layer message is a dict with a ``type`` naming the consumer handler (``book.snapshot``
calls ``book_snapshot``); what reaches the browser is the message's payload as JSON.
"""

from typing import Literal, TypedDict

BOOK_SNAPSHOT = "book.snapshot"


def order_book_group(market_slug: str) -> str:
    """The Channels group of one market's order-book watchers."""
    return f"market.{market_slug}.book"


class OrderBookLevel(TypedDict):
    """One prefix subtree of the waiting queue, aggregated and anonymous."""

    subtree: str  # opaque id of the subtree, stable within a round
    requests: int  # waiting requests in the subtree
    total_bid: float  # sum of their bids, dollars per second of waiting
    work_tokens: int  # uncached prompt tokens still to prefill in the subtree


class OrderBookSnapshot(TypedDict):
    """The order book of one market after one auction round (what the browser receives)."""

    market: str  # market slug
    round: int  # engine round number
    at: float  # Unix time of the round, seconds
    reserve: float  # reserve price, dollars per second of waiting
    levels: list[OrderBookLevel]


class BookSnapshotMessage(TypedDict):
    """The channel-layer message that carries an :class:`OrderBookSnapshot`."""

    type: Literal["book.snapshot"]
    snapshot: OrderBookSnapshot


def book_snapshot_message(snapshot: OrderBookSnapshot) -> BookSnapshotMessage:
    """Wrap ``snapshot`` for ``group_send``."""
    return {"type": BOOK_SNAPSHOT, "snapshot": snapshot}
