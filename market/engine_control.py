"""Tell a market's engine its ordering policy and reserve price when an operator changes them.

``market.services`` enqueues ``market.tasks.engine_config_push_enqueue`` with
``transaction.on_commit``; the Celery task ``scheduler_bridge.engine_config_push`` then sends
``{"policy", "reserve"}`` to the engine's control path (``scheduler_bridge.contract.wire``:
``POST <engine_url>/admin/market``, applied from its next round; ``Authorization: Bearer
ENGINE_ADMIN_TOKEN`` when that setting is set) through the one engine client. The task reads the
market when it runs, so it always sends the latest values: pushes that overtake each other or
run twice still leave the engine with what the database says.
"""

from __future__ import annotations

import logging
from typing import Literal

from django.conf import settings

from market.models import Market
from scheduler_bridge.client import EngineRejected, EngineUnavailable, engine_client

logger = logging.getLogger(__name__)

TIMEOUT_S = 2.0  # connect and read, seconds
RETRY_BASE_S = 1.0  # the first retry's delay; each next one doubles, seconds
RETRY_MAX_S = 60.0
MAX_RETRIES = 8  # about 4 minutes of retrying in all

PushOutcome = Literal["pushed", "no-market", "no-engine", "refused"]


class EngineUnreachable(Exception):
    """The engine could not be reached or answered 5xx: worth retrying."""


def retry_delay_s(retries: int) -> float:
    """Seconds before retry number ``retries + 1``: 1, 2, 4, ... capped at ``RETRY_MAX_S``."""
    return min(RETRY_BASE_S * 2**retries, RETRY_MAX_S)


def engine_config_push(*, market_id: int, timeout_s: float = TIMEOUT_S) -> PushOutcome:
    """POST the market's current policy and reserve ($/s) to its engine.

    Returns what happened; raises :class:`EngineUnreachable` when a retry may help. A market
    without an engine URL is skipped with a log line.
    """
    market = Market.objects.filter(pk=market_id).first()
    if market is None:
        logger.warning("engine config: market %s no longer exists; nothing pushed", market_id)
        return "no-market"
    base_url = market.engine_url.strip()
    if not base_url:
        logger.info("engine config: market %s has no engine URL; not pushed", market.slug)
        return "no-engine"
    client = engine_client()
    try:
        client.call_sync(
            lambda: client.control(
                base_url=base_url,
                policy=market.policy,
                reserve=float(market.reserve),
                token=settings.ENGINE_ADMIN_TOKEN,
                timeout_s=timeout_s,
            )
        )
    except EngineRejected as exc:
        # 401 (wrong token), 404 (an engine without this endpoint), 400: retrying won't help.
        logger.error(
            "engine config: %s refused policy %s, reserve %s for market %s: %s",
            base_url, market.policy, market.reserve, market.slug, exc.message[:500],
        )  # fmt: skip
        return "refused"
    except EngineUnavailable as exc:
        raise EngineUnreachable(f"{base_url}: {exc.message}") from exc
    logger.info(
        "engine config: market %s -> %s: policy %s, reserve %s $/s",
        market.slug, base_url, market.policy, market.reserve,
    )  # fmt: skip
    return "pushed"
