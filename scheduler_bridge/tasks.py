"""Celery tasks. Thin wrappers: the work belongs in services.

Scheduled by celery beat (``celery -A config beat``; ``CELERY_BEAT_SCHEDULE`` in
``config.settings``): ``rounds_consume`` every second, ``autobidders_step`` and
``hold_horizons_renew`` every ``AUTOBID_INTERVAL_S`` seconds, ``holds_sweep`` every minute,
``invoices_generate`` daily. The other apps' tasks are theirs: ``market.tasks`` (a market's
policy and reserve pushed to its engine) and ``openai_api.batches.tasks`` (batch runs).
"""

import logging
import os
import socket
from dataclasses import asdict
from typing import Any, TypedDict

from celery import Task, shared_task
from django.conf import settings

from accounts.services import settlement
from market import services as market_services
from market.live.periodic import live_tick
from scheduler_bridge.settlement import periodic
from scheduler_bridge.settlement import stream as rounds

logger = logging.getLogger(__name__)


class PingResult(TypedDict):
    """Who ran a :func:`ping`."""

    pong: bool
    worker: str  # the worker's node name (e.g. "celery@host"); the host name when eager
    pid: int  # process id of the worker that ran the task


@shared_task(bind=True, name="scheduler_bridge.ping")
def ping(self: Task) -> PingResult:
    """Answer with the worker's name and pid: proves a task crossed the broker to a worker."""
    return {
        "pong": True,
        "worker": self.request.hostname or socket.gethostname(),
        "pid": os.getpid(),
    }


# --- round records, pacing, invoices (thin wrappers over services) ---------------------------


@shared_task(
    bind=True,
    name="scheduler_bridge.rounds_consume",
    acks_late=True,  # a worker that dies mid-task leaves the message to be redelivered
    reject_on_worker_lost=True,
    soft_time_limit=60,  # seconds; a call is bounded by max_seconds long before this
    time_limit=90,
)
def rounds_consume(
    self: Task,
    *,
    stream: str | None = None,
    group: str = rounds.GROUP,
    max_seconds: float = 0.9,
    max_records: int = 1000,
    claim_min_idle_ms: int = rounds.CLAIM_MIN_IDLE_MS,
    until_idle: bool = False,
) -> dict[str, Any]:
    """Take round records from the Redis stream for up to ``max_seconds`` and publish them to
    the live consoles (beat: every second). They move no money: the gateway settles each
    request's charges from the engine's answer.

    Safe to run anywhere, any number of times, concurrently: the stream's consumer group hands
    each entry to one consumer, and entries are acknowledged once taken (checked and
    published). See ``scheduler_bridge.settlement.stream``.
    """
    if not settings.REDIS_URL:
        logger.warning("rounds_consume needs REDIS_URL (use `manage.py rounds_consume --jsonl`)")
        return rounds.ConsumeStats(stalled="REDIS_URL is not set").as_dict()
    client = rounds.redis_client(settings.REDIS_URL)
    try:
        sc = rounds.StreamConsumer(
            client=client,
            stream=stream or settings.ROUNDS_STREAM,
            group=group,
            # One name per process: what a dead process had pending is reclaimed by the others.
            consumer=f"{self.request.hostname or socket.gethostname()}:{os.getpid()}",
        )
        stats = rounds.rounds_consume(
            sc=sc,
            max_seconds=max_seconds,
            max_records=max_records,
            claim_min_idle_ms=claim_min_idle_ms,
            until_idle=until_idle,
        )
    finally:
        client.close()
    return stats.as_dict()


@shared_task(name="scheduler_bridge.live_publish", ignore_result=True)
def live_publish() -> dict[str, Any]:
    """Engine status of every open market and spend ticks of the tenants charged just now, to
    the consoles' websocket groups (beat: every second). See ``market.live.periodic``."""
    return live_tick().as_dict()


@shared_task(bind=True, name="scheduler_bridge.autobidders_step", acks_late=True)
def autobidders_step(self: Task, *, interval_s: float | None = None) -> dict[str, Any]:
    """One pacing step for each enabled autobidder that is due (beat: every AUTOBID_INTERVAL_S)."""
    interval = interval_s if interval_s is not None else settings.AUTOBID_INTERVAL_S
    return periodic.autobidders_step_due(interval_s=interval).as_dict()


@shared_task(name="scheduler_bridge.hold_horizons_renew", ignore_result=True)
def hold_horizons_renew() -> int:
    """Renew every active market's hold horizon from its recent charges (beat: every
    ``AUTOBID_INTERVAL_S``, beside the pacing steps); how many markets."""
    return market_services.hold_horizons_renew()


@shared_task(name="scheduler_bridge.holds_sweep", ignore_result=True)
def holds_sweep() -> dict[str, Any]:
    """Close what a lost gateway left open: requests still queued long after any request is
    served, failed uncharged (beat: every minute)."""
    return asdict(settlement.holds_sweep(stale_after_s=settings.STALE_REQUEST_S))


@shared_task(bind=True, name="scheduler_bridge.invoices_generate", acks_late=True)
def invoices_generate(self: Task) -> dict[str, Any]:
    """The previous UTC month's invoices where missing (beat: daily)."""
    return periodic.invoices_generate_previous_month().as_dict()
