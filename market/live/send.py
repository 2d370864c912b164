"""Sending payloads to Channels groups from synchronous code, in both deployment modes.

With Redis (``REDIS_URL``) the channel layer is shared by every process: a Celery worker sends,
Daphne's consumers receive. Without it the layer lives in memory, inside one process and one event
loop: the producer must run in the web server's process, and its messages must be sent from the
loop that serves the websockets. :func:`home_loop_set` names that loop (``config.embedded``
does it when it starts the publishers); sends from other threads are then handed to it.

A send never raises into the caller: live views are best effort, settlement must go on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Sequence

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from market.payloads import Payload, layer_message

logger = logging.getLogger(__name__)

SEND_TIMEOUT_S = 2.0  # how long a producer waits for the home loop to take its messages

_home_loop: asyncio.AbstractEventLoop | None = None


def home_loop_set(loop: asyncio.AbstractEventLoop | None) -> None:
    """Send every message from ``loop`` (the web server's), or, with None, from the caller's."""
    global _home_loop
    _home_loop = loop


async def _send_all(messages: Sequence[tuple[str, Payload]]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    for group, payload in messages:
        await layer.group_send(group, layer_message(payload))


def group_send_many(messages: Sequence[tuple[str, Payload]]) -> bool:
    """Send each ``(group, payload)`` in order; True when they were handed to the layer."""
    if not messages:
        return True
    try:
        loop = _home_loop
        if loop is not None and loop.is_running():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:  # already in the loop's thread: don't block it
                loop.create_task(_send_all(list(messages)))
                return True
            future = asyncio.run_coroutine_threadsafe(_send_all(list(messages)), loop)
            future.result(timeout=SEND_TIMEOUT_S)
            return True
        async_to_sync(_send_all)(list(messages))
        return True
    except (concurrent.futures.TimeoutError, TimeoutError):
        logger.warning("live: sending %d messages timed out", len(messages))
    except Exception:  # the layer is down (Redis away): the next publish catches up
        logger.warning("live: could not send %d messages", len(messages), exc_info=True)
    return False


def group_send(group: str, payload: Payload) -> bool:
    """Send one payload to one group (see :func:`group_send_many`)."""
    return group_send_many([(group, payload)])
