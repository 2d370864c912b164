"""Reads of batch jobs: a tenant's batches in OpenAI's batch shape, and their result files.

Results are JSONL, one line per item in input order: ``{"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}``. ``body`` is exactly what the endpoint would
have answered (the completion with its ``usage`` and ``auction``, or its error body); ``error``
is null for a served item, else ``{"code", "message"}``.

- output: every item that got an answer (served, or refused with a status and an error body);
- errors: every item that was not served: refused or failed (as in the output) and cancelled
  ones (``response`` null, ``error.code`` ``batch_cancelled``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from accounts.models import Tenant
from openai_api.models import BatchItem, BatchJob, BatchStatus, ItemStatus

OUTPUT = "output"
ERRORS = "errors"
_KINDS = {
    OUTPUT: (ItemStatus.COMPLETED, ItemStatus.FAILED),
    ERRORS: (ItemStatus.FAILED, ItemStatus.CANCELLED),
}


def batches_for_tenant(*, tenant: Tenant) -> QuerySet[BatchJob]:
    """The tenant's batches, newest first (the input text deferred)."""
    return BatchJob.objects.filter(tenant=tenant).defer("input").order_by("-created_at", "-id")


def batch_for_tenant(*, tenant: Tenant, public_id: str) -> BatchJob:
    """The tenant's batch ``public_id``; BatchJob.DoesNotExist otherwise (another tenant's
    batch included)."""
    return batches_for_tenant(tenant=tenant).get(public_id=public_id)


def _unix(at: datetime | None) -> int | None:
    return int(at.timestamp()) if at is not None else None


def batch_body(batch: BatchJob) -> dict[str, Any]:
    """OpenAI's batch object, with our result URLs instead of file ids."""
    finished = batch.finished_at
    base = f"/v1/batches/{batch.public_id}"
    return {
        "id": batch.public_id,
        "object": "batch",
        "endpoint": batch.endpoint or None,
        "model": batch.model or None,
        "status": batch.status,
        "errors": {"object": "list", "data": [{"code": "batch_failed", "message": batch.error}]}
        if batch.error
        else None,
        "output_url": base + "/output",
        "errors_url": base + "/errors",
        "created_at": _unix(batch.created_at),
        "in_progress_at": _unix(batch.started_at),
        "completed_at": _unix(finished) if batch.status == BatchStatus.COMPLETED else None,
        "failed_at": _unix(finished) if batch.status == BatchStatus.FAILED else None,
        "cancelling_at": _unix(batch.cancelled_at),
        "cancelled_at": _unix(finished) if batch.status == BatchStatus.CANCELLED else None,
        "request_counts": {
            "total": batch.total,
            "completed": batch.completed,
            "failed": batch.failed,
            "cancelled": batch.cancelled,
        },
        "metadata": batch.metadata or None,
    }


def result_lines(*, batch: BatchJob, kind: str) -> Iterator[str]:
    """The ``kind`` file (OUTPUT or ERRORS) of a batch, line by line (each ends in a newline)."""
    items = (
        BatchItem.objects.filter(batch=batch, status__in=_KINDS[kind])
        .order_by("line")
        .only("pk", "custom_id", "status", "status_code", "request_id", "response", "error")
    )
    for item in items.iterator(chunk_size=500):
        yield json.dumps(result_line(item), separators=(",", ":")) + "\n"


def result_line(item: BatchItem) -> dict[str, Any]:
    """One item's line of the result files."""
    if item.status == ItemStatus.CANCELLED:
        response = None
        error = {"code": "batch_cancelled", "message": "the batch was cancelled before this ran"}
    else:
        response = {
            "status_code": item.status_code,
            "request_id": item.request_id or None,
            "body": item.response,
        }
        error = item.error
    return {
        "id": f"batch_req_{item.pk}",
        "custom_id": item.custom_id,
        "response": response,
        "error": error,
    }
