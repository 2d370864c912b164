"""Driving a batch through the gateway's own request flow (``request_admit_for``, the engine
client, the token charge), a few items at a time, each at its line's bid.

Exactly once, whatever dies when:

- One run per batch at a time: a run holds a PostgreSQL advisory lock on its batch for as long
  as it runs (a session lock: it goes with the connection when its worker dies). A task
  delivered again while the first still runs finds the lock taken and leaves the batch to it.
- An item's answer is written in the same transaction as its token charge
  (``completion_forward(on_settled=...)``): an item is either served, charged and answered, or
  none of the three.
- Each attempt of an item is one gateway request whose id is derived from (batch, custom_id,
  attempt) (:func:`item_request_id`), recorded on the item before the request is admitted. A
  run that finds an item still ``running`` (its worker died) looks that request up: never
  opened, it is tried under the same id; opened and not finished, its hold is released
  (``request_fail``: never charged) and the item tried again as its next attempt. Finished
  items are skipped. So an item is charged for one request only, and no hold is left behind.
  One edge stays: if the engine had already admitted the dead run's attempt and its round
  record was settled before the attempt was released, that attempt keeps its priority charge
  (a real admission); a round record arriving after the release charges nothing.

Refusals are answers, not retries: an exhausted budget fails that item with the 429
``insufficient_quota`` body and the batch goes on (waiting would not refill the budget); an
engine that is down fails items with the 503 body, uncharged. Only a full engine queue (429
``queue_full``, ``EngineBusy``) is waited out and retried, up to ``BATCH_BUSY_RETRIES`` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from accounts.models import ApiKey, Request, RequestStatus
from accounts.services import request_fail
from engines.client import engine_client
from openai_api.batches.input import body_params
from openai_api.batches.services import batch_finished, batch_started, item_finished
from openai_api.gateway import admission, services
from openai_api.gateway.db import db_call
from openai_api.gateway.errors import EngineBusy, GatewayError, InvalidApiKey, ServerError
from openai_api.gateway.validation import CompletionParams
from openai_api.models import BatchItem, BatchJob, ItemStatus

logger = logging.getLogger(__name__)

# Namespace of the items' request ids (uuid5); fixed forever, so ids are stable across runs.
REQUEST_NAMESPACE = uuid.UUID("5b0e7d1c-3f4a-4c2e-9a61-0d2f6b8e9c17")
LOCK_CLASS = 0x62617463  # "batc": the advisory lock's first key; the batch's id is the second
LOCK_WAIT_S = 10.0  # how long a run waits for the lock before leaving the batch to its holder
MAX_BUSY_WAIT_S = 30.0
UNFINISHED = (ItemStatus.PENDING, ItemStatus.RUNNING)  # the items a run has left to finish
# Awaited after each item's request is admitted (its hold placed) and before it is sent to the
# engine. Empty in production; tests register one to hold items there (to cancel a batch mid-run,
# or to kill a worker with requests open).
BEFORE_FORWARD: list[Callable[[], Awaitable[None]]] = []


def item_request_id(*, batch_public_id: str, custom_id: str, attempt: int) -> str:
    """The gateway request id of an item's ``attempt`` (1, 2, ...): the same on every run."""
    name = f"{batch_public_id}\n{attempt}\n{custom_id}"
    return "batch-" + uuid.uuid5(REQUEST_NAMESPACE, name).hex


@dataclass(frozen=True)
class Claim:
    """An item being run: its current attempt's request id and its checked body."""

    item_id: int
    request_id: str
    params: CompletionParams


def batch_run(*, batch_id: int) -> dict[str, Any]:
    """Run what is left of a batch (synchronous: a Celery task calls it). Returns the batch's
    status and counts, or ``{"skipped": why}`` when there was nothing for this run to do."""
    with _run_lock(batch_id) as held:
        if not held:
            return {"skipped": "another run of this batch is in progress"}
        batch = batch_started(batch_id=batch_id)
        if batch is None:
            return {"skipped": "no such batch, or it has finished"}
        try:
            asyncio.run(_drive(batch))
        except Exception as exc:
            logger.exception("batch %s: the run failed", batch.public_id)
            error = f"the batch run failed: {exc!r}"
            _items_failed(batch, error)
            batch = batch_finished(batch_id=batch_id, error=error)
        else:
            batch = batch_finished(batch_id=batch_id)
    return {
        "batch": batch.public_id,
        "status": batch.status,
        "completed": batch.completed,
        "failed": batch.failed,
        "cancelled": batch.cancelled,
    }


@contextlib.contextmanager
def _run_lock(batch_id: int) -> Iterator[bool]:
    """Whether this process now holds the batch's run lock (a PostgreSQL advisory lock)."""
    # A run whose worker was just killed may hold it a moment longer: until PostgreSQL sees
    # its connection close.
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_CLASS, batch_id])
            held = cursor.fetchone()[0]
        if held or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    try:
        yield held
    finally:
        if held:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_CLASS, batch_id])


async def _drive(batch: BatchJob) -> None:
    ids = await db_call(_open_item_ids, batch_id=batch.pk)
    slots = asyncio.Semaphore(settings.BATCH_CONCURRENCY)

    async def one(item_id: int) -> None:
        async with slots:
            await _item_run(batch, item_id)

    try:
        await asyncio.gather(*(one(item_id) for item_id in ids))
    finally:
        await engine_client().aclose()


def _open_item_ids(*, batch_id: int) -> list[int]:
    return list(
        BatchItem.objects.filter(batch_id=batch_id, status__in=UNFINISHED)
        .order_by("line")
        .values_list("pk", flat=True)
    )


async def _item_run(batch: BatchJob, item_id: int) -> None:
    claim = await db_call(item_claimed, batch=batch, item_id=item_id)
    retries = settings.BATCH_BUSY_RETRIES
    while claim is not None:
        try:
            admitted = await db_call(
                admission.request_admit_for,
                params=claim.params,
                tenant=batch.tenant,
                api_key=batch.api_key,
                request_id=claim.request_id,
            )
            for hook in BEFORE_FORWARD:
                await hook()
            await services.completion_forward(
                params=claim.params,
                admitted=admitted,
                trace=services.Trace(endpoint=claim.params.endpoint),
                on_settled=functools.partial(
                    _served, item_id=claim.item_id, request_id=claim.request_id
                ),
            )
            return
        except GatewayError as exc:
            # By type, not by status: an exhausted budget is a 429 too (insufficient_quota),
            # and is that line's answer.
            if isinstance(exc, EngineBusy) and retries > 0:
                retries -= 1
                wait = min(float(exc.headers.get("Retry-After", 1)), MAX_BUSY_WAIT_S)
                await asyncio.sleep(wait)
                claim = await db_call(item_next_attempt, batch=batch, claim=claim)
                continue
            await db_call(_failed, item_id=claim.item_id, request_id=claim.request_id, exc=exc)
            return
        except Exception as exc:  # noqa: BLE001 (one item's surprise must not stop the batch)
            logger.exception("batch %s: item %s failed", batch.public_id, item_id)
            error = ServerError(f"internal error while running the item: {exc!r}")
            await db_call(request_fail, request_id=claim.request_id)  # release any hold
            await db_call(_failed, item_id=claim.item_id, request_id=claim.request_id, exc=error)
            return


def _served(body: dict[str, Any], *, item_id: int, request_id: str) -> None:
    """Keep the item's answer, in its token charge's transaction (which this rolls back when
    the item is no longer this attempt's to answer)."""
    if not item_finished(
        item_id=item_id,
        request_id=request_id,
        status=ItemStatus.COMPLETED,
        status_code=200,
        response=body,
        error=None,
    ):
        raise RuntimeError(f"item {item_id} is no longer running attempt {request_id}")


def _failed(*, item_id: int, request_id: str, exc: GatewayError) -> None:
    """Finish the item's attempt ``request_id`` as failed, answered with ``exc``'s body."""
    item_finished(
        item_id=item_id,
        request_id=request_id,
        status=ItemStatus.FAILED,
        status_code=exc.status,
        response=exc.body(),
        error={"code": exc.code, "message": exc.message},
    )


def item_claimed(*, batch: BatchJob, item_id: int) -> Claim | None:
    """Start (or take over) an item: its attempt's request id, recorded before anything is
    admitted under it. None when it has finished, or is finished here (a revoked key, a body
    the gateway no longer accepts)."""
    with transaction.atomic():
        item = (
            BatchItem.objects.select_for_update().filter(pk=item_id, status__in=UNFINISHED).first()
        )
        if item is None:
            return None
        attempt = item.attempts or 1
        if item.request_id:
            earlier = (
                Request.objects.filter(request_id=item.request_id)
                .values_list("status", flat=True)
                .first()
            )
            if earlier == RequestStatus.SERVED:  # cannot happen: answers commit with charges
                _failed(item_id=item.pk, request_id=item.request_id, exc=_lost(item.request_id))
                return None
            if earlier is not None:  # opened by a run that died, or failed: never charged
                request_fail(request_id=item.request_id)
                attempt = item.attempts + 1
        refusal: GatewayError | None = None
        params = None
        if batch.api_key_id is not None and not _key_active(batch.api_key_id):
            refusal = InvalidApiKey("the batch's API key has been revoked")
        else:
            try:
                params = body_params(item.body, url=item.url)
            except GatewayError as exc:
                refusal = exc
        item.status, item.attempts = ItemStatus.RUNNING, attempt
        item.request_id = item_request_id(
            batch_public_id=batch.public_id, custom_id=item.custom_id, attempt=attempt
        )
        item.save(update_fields=["status", "attempts", "request_id"])
        if refusal is not None:
            _failed(item_id=item.pk, request_id=item.request_id, exc=refusal)
            return None
    assert params is not None
    return Claim(item_id=item.pk, request_id=item.request_id, params=params)


def item_next_attempt(*, batch: BatchJob, claim: Claim) -> Claim | None:
    """After a refused attempt (its request failed, its hold released): the next one."""
    with transaction.atomic():
        item = (
            BatchItem.objects.select_for_update()
            .filter(pk=claim.item_id, status=ItemStatus.RUNNING, request_id=claim.request_id)
            .first()
        )
        if item is None:
            return None
        item.attempts += 1
        item.request_id = item_request_id(
            batch_public_id=batch.public_id, custom_id=item.custom_id, attempt=item.attempts
        )
        item.save(update_fields=["attempts", "request_id"])
    return Claim(item_id=item.pk, request_id=item.request_id, params=claim.params)


def _key_active(api_key_id: int) -> bool:
    return ApiKey.objects.filter(pk=api_key_id, revoked_at__isnull=True).exists()


def _lost(request_id: str) -> GatewayError:
    return ServerError(
        f"request {request_id} was served and charged but its answer was not kept; "
        "it is not run again",
        code="answer_lost",
    )


def _items_failed(batch: BatchJob, message: str) -> None:
    """After the run itself failed (nothing of it in flight any more): fail every item it left,
    releasing the holds of attempts it had opened."""
    error = ServerError(message, code="batch_failed")
    left = BatchItem.objects.filter(batch=batch, status__in=UNFINISHED)
    for request_id in left.exclude(request_id="").values_list("request_id", flat=True):
        request_fail(request_id=request_id)
    left.update(
        status=ItemStatus.FAILED,
        status_code=500,
        response=error.body(),
        error={"code": error.code, "message": message},
        finished_at=timezone.now(),
    )
