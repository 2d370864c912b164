"""The batch API's Celery task: ``batch_run``, queued by :func:`batch_enqueue` when a batch job
is submitted (the views pass it to ``batches.services.batch_create``). Thin: the work is in
``openai_api.batches.run``."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task
from django.conf import settings

from openai_api.batches import run as batches_run


@shared_task(
    bind=True,
    name="openai_api.batch_run",
    acks_late=True,  # a worker that dies mid-batch leaves the message to be redelivered
    reject_on_worker_lost=True,
)
def batch_run(self: Task, batch_id: int) -> dict[str, Any]:
    """Drive a batch job's remaining items through the engine (``openai_api.batches``).
    Safe to run again at any point: finished items are skipped, none is charged twice."""
    return batches_run.batch_run(batch_id=batch_id)


def batch_enqueue(*, batch_id: int) -> None:
    """Queue the batch's run (on ``BATCH_QUEUE`` when set, else Celery's default queue)."""
    queue = settings.BATCH_QUEUE
    batch_run.apply_async(args=[batch_id], **({"queue": queue} if queue else {}))
