"""The bridge's Celery tasks: ``rounds_consume`` (celery beat: every second; see
``CELERY_BEAT_SCHEDULE`` in ``config.settings``) and ``ping``. Thin wrappers: the work belongs
in ``settlement``.

Each package names its own tasks (``accounts.tasks``, ``market.tasks``,
``openai_api.batches.tasks``). Some of them were once named ``scheduler_bridge.*``: messages
queued under those names before an upgrade are forwarded to the new names (:data:`RENAMED`)
until the queues have drained.
"""

import logging
import os
import socket
from dataclasses import asdict
from typing import Any, TypedDict

from celery import Task, shared_task
from django.conf import settings

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


# --- round records ---------------------------------------------------------------------------


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
        logger.warning("rounds_consume needs REDIS_URL")
        return asdict(rounds.ConsumeStats(stalled="REDIS_URL is not set"))
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
    return asdict(stats)


# --- names of tasks that moved to their packages -------------------------------------------

# Old name -> the name the task has now. A release after the one that renamed them can drop this.
RENAMED = {
    "scheduler_bridge.live_publish": "market.live_publish",
    "scheduler_bridge.hold_horizons_renew": "market.hold_horizons_renew",
    "scheduler_bridge.engine_config_push": "market.engine_config_push",
    "scheduler_bridge.autobidders_step": "accounts.autobidders_step",
    "scheduler_bridge.holds_sweep": "accounts.holds_sweep",
    "scheduler_bridge.invoices_generate": "accounts.invoices_generate",
    "scheduler_bridge.batch_run": "openai_api.batch_run",
}


def _forward(old: str, new: str) -> Task:
    """A task under the ``old`` name that queues its message again under ``new``, on the queue
    it came from; it answers the id of the forwarded task."""

    @shared_task(bind=True, name=old, acks_late=True, reject_on_worker_lost=True)
    def forwarded(self: Task, *args: Any, **kwargs: Any) -> str:
        queue = (self.request.delivery_info or {}).get("routing_key")
        logger.info("celery: %s queued under its old name, forwarded to %s", old, new)
        sent = self.app.send_task(new, args=args, kwargs=kwargs, queue=queue)
        return str(sent.id)

    return forwarded


FORWARDS = {old: _forward(old, new) for old, new in RENAMED.items()}
