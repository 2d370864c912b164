"""The batch API's Celery task: ``batch_run``, queued by :func:`batch_enqueue` when a batch job
is submitted (the views pass it to ``batches.services.batch_create``). Thin: the work is in
``openai_api.batches.run``."""

from __future__ import annotations

import threading
from typing import Any

from celery import Task, shared_task
from django.conf import settings
from django.db import connections

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


def batch_enqueue(*, batch_id: int) -> threading.Thread | None:
    """Queue the batch's run (on ``BATCH_QUEUE`` when set, else Celery's default queue).

    Without a worker (embedded mode: Celery eager) the run goes to a thread of its own, with its
    own event loop and database connection, which is returned: run inline it would hold the
    request that submitted the batch (a gateway database thread, or the console's page) until
    the last line was served.
    """
    if batch_run.app.conf.task_always_eager:
        thread = threading.Thread(
            target=_run_beside, args=(batch_id,), name=f"batch-{batch_id}", daemon=True
        )
        thread.start()
        return thread
    queue = settings.BATCH_QUEUE
    batch_run.apply_async(args=[batch_id], **({"queue": queue} if queue else {}))
    return None


def _run_beside(batch_id: int) -> None:
    try:
        batch_run.apply(args=[batch_id])  # eager: logs and keeps a failure, never raises here
    finally:
        connections.close_all()
