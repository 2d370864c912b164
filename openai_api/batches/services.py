"""Writes of batch jobs: submit (checked up front, nothing written for a bad file), cancel,
and the state changes of items and batches, each a conditional UPDATE so that two processes
(a task run again after its worker died, a cancel meanwhile) never both apply one change."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Annotated, Any

from django.db import transaction
from django.db.models import Count, F, Q
from django.utils import timezone
from pydantic import BaseModel, ConfigDict, Field, PlainValidator

from accounts.models import ApiKey, Tenant
from openai_api.batches.input import lines_checked
from openai_api.gateway.errors import GatewayError, InvalidValue, MalformedRequest
from openai_api.gateway.refusals import LEFT_OUT_AS_NULL, as_validator
from openai_api.models import BatchItem, BatchJob, BatchStatus, ItemStatus

MAX_METADATA_KEYS = 16  # OpenAI's limits on a batch's metadata
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


class BatchNotFound(GatewayError):
    """404: no such batch for this tenant (another tenant's batch is not found either)."""

    status = 404
    code = "batch_not_found"


class BatchNotCancellable(GatewayError):
    """409: the batch has already finished."""

    status = 409
    code = "batch_not_cancellable"


def metadata_checked(metadata: Any) -> dict[str, str]:
    """At most 16 string keys (64 characters) with string values (512 characters)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise MalformedRequest("metadata must be an object of strings", param="metadata")
    if len(metadata) > MAX_METADATA_KEYS:
        raise InvalidValue(f"metadata takes at most {MAX_METADATA_KEYS} keys", param="metadata")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise MalformedRequest(f"metadata[{key!r}] must be a string", param="metadata")
        if len(key) > MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS:
            raise InvalidValue(f"metadata[{key!r}] is too long", param="metadata")
    return dict(metadata)


def _jsonl_text(value: Any, context: Any) -> str:
    if not isinstance(value, str):
        raise MalformedRequest(
            'a JSON body must be {"input": "<JSONL text>", "metadata": {...}}; or send the '
            "JSONL itself as application/jsonl",
            param="input",
        )
    return value


_Metadata = Annotated[
    dict[
        Annotated[str, Field(max_length=MAX_METADATA_KEY_CHARS)],
        Annotated[str, Field(max_length=MAX_METADATA_VALUE_CHARS)],
    ]
    | None,
    Field(max_length=MAX_METADATA_KEYS),
]


class BatchCreateRequest(BaseModel):
    """``POST /v1/batches`` as JSON; the JSONL itself may be sent instead (application/jsonl).
    The metadata is checked by ``metadata_checked`` when the batch is created."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"required": ["input"]})

    input: Annotated[
        str,
        PlainValidator(as_validator(_jsonl_text), json_schema_input_type=str),
        Field(description="the JSONL text, a BatchLineRequest per line"),
    ] = LEFT_OUT_AS_NULL
    metadata: Annotated[Any, PlainValidator(lambda v: v, json_schema_input_type=_Metadata)] = None


def batch_create(
    *,
    tenant: Tenant,
    api_key: ApiKey | None,
    text: str,
    metadata: Any = None,
    submitted_by: str = "",
    enqueue: Callable[..., object] | None = None,
) -> BatchJob:
    """Check every line of ``text`` (BatchInputInvalid, BatchTooLarge: nothing written), store
    the batch and its items, and once they commit call ``enqueue(batch_id=...)`` (the views pass
    ``openai_api.batches.tasks.batch_enqueue``; None: the caller runs the batch itself)."""
    lines = lines_checked(text)
    checked_metadata = metadata_checked(metadata)
    urls = {line.url for line in lines}
    models = {line.params.model for line in lines}
    now = timezone.now()
    with transaction.atomic():
        batch = BatchJob.objects.create(
            public_id="batch_" + uuid.uuid4().hex,
            tenant=tenant,
            api_key=api_key,
            submitted_by=submitted_by,
            endpoint=urls.pop() if len(urls) == 1 else "",
            model=models.pop()[:200] if len(models) == 1 else "",
            input=text,
            metadata=checked_metadata,
            total=len(lines),
            created_at=now,
        )
        BatchItem.objects.bulk_create(
            [
                BatchItem(
                    batch=batch, line=ln.line, custom_id=ln.custom_id, url=ln.url, body=ln.body
                )
                for ln in lines
            ],
            batch_size=1000,
        )
        if enqueue is not None:
            transaction.on_commit(lambda: enqueue(batch_id=batch.pk))
    return batch


def batch_cancel(*, batch: BatchJob) -> BatchJob:
    """Cancel a batch: its pending items are cancelled at once, items in flight finish; the
    batch is ``cancelling`` until its run ends (``cancelled`` at once if none has started)."""
    now = timezone.now()
    with transaction.atomic():
        locked = BatchJob.objects.select_for_update().get(pk=batch.pk)
        if not locked.is_open:
            raise BatchNotCancellable(f"the batch is already {locked.status}")
        cancelled = BatchItem.objects.filter(batch=locked, status=ItemStatus.PENDING).update(
            status=ItemStatus.CANCELLED, finished_at=now
        )
        running = BatchItem.objects.filter(batch=locked, status=ItemStatus.RUNNING).exists()
        locked.cancelled = F("cancelled") + cancelled
        locked.cancelled_at = locked.cancelled_at or now
        if locked.status == BatchStatus.VALIDATING and not running:
            locked.status, locked.finished_at = BatchStatus.CANCELLED, now
        else:
            locked.status = BatchStatus.CANCELLING
        locked.save(update_fields=["cancelled", "cancelled_at", "status", "finished_at"])
    locked.refresh_from_db()
    return locked


def batch_started(*, batch_id: int) -> BatchJob | None:
    """Mark the batch in progress (a run starts or starts again); None when there is nothing
    to run: no such batch, or it has finished."""
    now = timezone.now()
    BatchJob.objects.filter(pk=batch_id, status=BatchStatus.VALIDATING).update(
        status=BatchStatus.IN_PROGRESS, started_at=now
    )
    batch = BatchJob.objects.select_related("tenant", "api_key").filter(pk=batch_id).first()
    if batch is None or not batch.is_open:
        return None
    return batch


def item_finished(
    *,
    item_id: int,
    request_id: str,
    status: str,
    status_code: int | None,
    response: dict[str, Any] | None,
    error: dict[str, Any] | None,
) -> bool:
    """Record an item's answer if its attempt ``request_id`` is still the one running, and count
    it in its batch; False (nothing written) otherwise."""
    now = timezone.now()
    with transaction.atomic():
        updated = BatchItem.objects.filter(
            pk=item_id, status=ItemStatus.RUNNING, request_id=request_id
        ).update(
            status=status,
            status_code=status_code,
            response=response,
            error=error,
            finished_at=now,
        )
        if updated:
            counter = "completed" if status == ItemStatus.COMPLETED else "failed"
            batch_id = BatchItem.objects.filter(pk=item_id).values_list("batch_id", flat=True)[0]
            BatchJob.objects.filter(pk=batch_id).update(**{counter: F(counter) + 1})
    return bool(updated)


def batch_finished(*, batch_id: int, error: str = "") -> BatchJob:
    """End a run: recount the items; ``cancelled`` if it was cancelled, ``failed`` with
    ``error``, else ``completed`` once no item is left to run."""
    now = timezone.now()
    with transaction.atomic():
        batch = BatchJob.objects.select_for_update().get(pk=batch_id)
        counts = BatchItem.objects.filter(batch=batch).aggregate(
            **{s: Count("pk", filter=Q(status=s)) for s in ItemStatus.values}
        )
        batch.completed = counts[ItemStatus.COMPLETED]
        batch.failed = counts[ItemStatus.FAILED]
        batch.cancelled = counts[ItemStatus.CANCELLED]
        left = counts[ItemStatus.PENDING] + counts[ItemStatus.RUNNING]
        if batch.is_open:
            if error:
                batch.status, batch.error = BatchStatus.FAILED, error
            elif batch.status == BatchStatus.CANCELLING and counts[ItemStatus.RUNNING] == 0:
                batch.status = BatchStatus.CANCELLED
            elif left == 0:
                batch.status = BatchStatus.COMPLETED
            if not batch.is_open:
                batch.finished_at = now
        batch.save()
    return batch
