"""Tell a market's engine its ordering policy and reserve price when an operator changes them.

``market.services`` enqueues ``market.tasks.engine_config_push_enqueue`` with
``transaction.on_commit``; the Celery task ``scheduler_bridge.engine_config_push`` then POSTs
``{"policy", "reserve"}`` to ``<engine_url>/admin/market`` (the simulated engine's control endpoint,
applied from its next round; ``Authorization: Bearer ENGINE_ADMIN_TOKEN`` when that setting is set).
The task reads the market when it runs, so it always sends the latest values: pushes that overtake
each other or run twice still leave the engine with what the database says.
"""

from __future__ import annotations

import logging
from typing import Literal

import httpx
from django.conf import settings

from market.models import Market

logger = logging.getLogger(__name__)

ADMIN_PATH = "/admin/market"
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
    url = base_url.rstrip("/") + ADMIN_PATH
    body = {"policy": market.policy, "reserve": float(market.reserve)}
    token = settings.ENGINE_ADMIN_TOKEN
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.post(url, json=body, headers=headers, timeout=timeout_s)
    except httpx.TransportError as exc:
        raise EngineUnreachable(f"{url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code >= 500:
        raise EngineUnreachable(f"{url}: HTTP {response.status_code}")
    if response.status_code >= 400:
        # 401 (wrong token), 404 (an engine without this endpoint), 400: retrying won't help.
        logger.error(
            "engine config: %s refused %s for market %s: HTTP %d %s",
            url, body, market.slug, response.status_code, response.text[:500],
        )  # fmt: skip
        return "refused"
    logger.info(
        "engine config: market %s -> %s: policy %s, reserve %s $/s",
        market.slug, base_url, market.policy, market.reserve,
    )  # fmt: skip
    return "pushed"
