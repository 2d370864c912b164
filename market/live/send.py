"""Sending payloads to Channels groups from synchronous code.

The channel layer is Redis (``REDIS_URL``), shared by every process: a Celery worker sends, the
web server's consumers receive. A send never raises into the caller: live views are best
effort, settlement must go on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from market.payloads import Payload, layer_message

logger = logging.getLogger(__name__)


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
        async_to_sync(_send_all)(list(messages))
        return True
    except Exception:  # the layer is down (Redis away): the next publish catches up
        logger.warning("live: could not send %d messages", len(messages), exc_info=True)
    return False


def group_send(group: str, payload: Payload) -> bool:
    """Send one payload to one group (see :func:`group_send_many`)."""
    return group_send_many([(group, payload)])
