"""The market's Celery tasks: ``engine_config_push``, queued by ``market.services`` (through
:func:`engine_config_push_enqueue`) when an operator changes a market's reserve or policy; and
what celery beat drives (``CELERY_BEAT_SCHEDULE`` in ``config.settings``): ``live_publish``
every second, ``hold_horizons_renew`` every ``AUTOBID_INTERVAL_S`` seconds, ``reserves_auto_step``
and ``wait_bounds_renew`` every ``AUTO_RESERVE_INTERVAL_S`` seconds."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, shared_task
from django.conf import settings

from market import engine_control, holds, reserves, wait_bounds
from market.live.periodic import live_tick

logger = logging.getLogger(__name__)


@shared_task(
    bind=True,
    name="market.engine_config_push",
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=engine_control.MAX_RETRIES,
)
def engine_config_push(self: Task, *, market_id: int, url: str | None = None) -> str:
    """POST a market's policy and reserve to its engines (``url``: to that one); an engine that
    is away is retried with backoff on its own, the others are not pushed again."""
    try:
        return engine_control.engine_config_push(market_id=market_id, url=url)
    except engine_control.EngineUnreachable as exc:
        delay = engine_control.retry_delay_s(self.request.retries)
        logger.warning("engine config: %s; retrying in %g s", exc, delay)
        retry, *others = exc.urls or (url,)
        queue = (self.request.delivery_info or {}).get("routing_key")
        for other in others:  # each further engine away gets a retry of its own
            engine_config_push.apply_async(
                kwargs={"market_id": market_id, "url": other}, countdown=delay, queue=queue
            )
        raise self.retry(
            exc=exc, countdown=delay, kwargs={"market_id": market_id, "url": retry}
        ) from exc


def engine_config_push_enqueue(*, market_id: int) -> None:
    """Queue the push (call it from ``transaction.on_commit``). Never raises: a broker outage
    or, in eager mode, an engine failure is logged, and the operator's change stands."""
    try:
        engine_config_push.delay(market_id=market_id)
    except Exception:
        logger.exception("engine config: could not queue the push for market %s", market_id)


@shared_task(name="market.live_publish", ignore_result=True)
def live_publish() -> dict[str, Any]:
    """Engine status of every open market and spend ticks of the tenants charged just now, to
    the consoles' websocket groups (beat: every second). See ``market.live.periodic``."""
    return live_tick().as_dict()


@shared_task(name="market.hold_horizons_renew", ignore_result=True)
def hold_horizons_renew() -> int:
    """Renew every active market's hold horizon from its recent charges (beat: every
    ``AUTOBID_INTERVAL_S``, beside the pacing steps); how many markets."""
    return holds.hold_horizons_renew()


@shared_task(name="market.reserves_auto_step", ignore_result=True)
def reserves_auto_step() -> int:
    """One step of every automatic reserve (beat: every ``AUTO_RESERVE_INTERVAL_S``), then the
    push of each reserve moved to its market's engines; how many moved."""
    moves = reserves.reserves_auto_step(interval_s=settings.AUTO_RESERVE_INTERVAL_S)
    for move in moves:
        engine_config_push_enqueue(market_id=move.market_id)
    return len(moves)


@shared_task(name="market.wait_bounds_renew", ignore_result=True)
def wait_bounds_renew() -> int:
    """Renew every automatic wait bound (beat: every ``AUTO_RESERVE_INTERVAL_S``), then the
    push of each bound moved to its market's engines; how many moved."""
    moves = wait_bounds.wait_bounds_renew()
    for move in moves:
        engine_config_push_enqueue(market_id=move.market_id)
    return len(moves)
