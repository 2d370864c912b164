"""The batch endpoints of the gateway, OpenAI's Batch API adapted to bids (thin: the work is in
``openai_api.batches``). API-key authenticated; a key sees its own tenant's batches only.

- ``POST /v1/batches``: the JSONL itself (``Content-Type: application/jsonl``, ``text/plain``,
  ...), or JSON ``{"input": "<jsonl text>", "metadata": {...}}``. 200 with the batch object;
  a bad file is refused whole (400/422 listing each bad line, 413 when too large).
- ``GET /v1/batches`` (newest first; ``limit`` 1..100, ``after`` a batch id),
  ``GET /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``.
- ``GET /v1/batches/{id}/output`` and ``/errors``: JSONL (``batches.selectors``).

A batch id, ``after`` or ``limit`` that is not plain text (a NUL) is a 400 naming it.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from accounts.text import whole_number
from openai_api.batches import selectors, tasks
from openai_api.batches.input import input_decoded, max_bytes, size_checked
from openai_api.batches.services import (
    BatchCreateRequest,
    BatchNotFound,
    batch_cancel,
    batch_create,
)
from openai_api.gateway.db import db_call
from openai_api.gateway.errors import MalformedRequest
from openai_api.gateway.keys import api_key_authenticated
from openai_api.gateway.refusals import body_parsed, text_checked, validated
from openai_api.gateway.views import _bearer, refusals_answered
from openai_api.models import BatchJob

DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 100
JSONL = "application/jsonl"


def _raw_body(request: HttpRequest) -> bytes:
    """The body, read past Django's DATA_UPLOAD_MAX_MEMORY_SIZE up to ``BATCH_MAX_BYTES``."""
    length = request.META.get("CONTENT_LENGTH")
    if length and length.isdigit():
        size_checked(int(length))
    raw = request.read(max_bytes() + 1)
    size_checked(len(raw))
    return raw


def _submitted(request: HttpRequest) -> tuple[str, Any]:
    """(the JSONL text, the metadata) of a POST."""
    raw = _raw_body(request)
    content_type = request.content_type or ""
    if content_type != "application/json":
        return input_decoded(raw), None
    form = validated(BatchCreateRequest, body_parsed(raw))
    return form.input, form.metadata


def _create(*, key: str | None, text: str, metadata: Any) -> dict[str, Any]:
    api_key = api_key_authenticated(key=key)
    batch = batch_create(
        tenant=api_key.tenant,
        api_key=api_key,
        text=text,
        metadata=metadata,
        enqueue=tasks.batch_enqueue,
    )
    return selectors.batch_body(batch)


def _list(*, key: str | None, limit: str | None, after: str | None) -> dict[str, Any]:
    api_key = api_key_authenticated(key=key)
    try:
        count = (
            DEFAULT_LIST_LIMIT if limit is None else whole_number(limit, low=1, high=MAX_LIST_LIMIT)
        )
    except ValueError as exc:
        raise MalformedRequest(f"limit {exc}", param="limit") from None
    batches = selectors.batches_for_tenant(tenant=api_key.tenant)
    if after:
        cursor = _batch(api_key.tenant, after, param="after")
        batches = batches.filter(created_at__lte=cursor.created_at).exclude(
            created_at=cursor.created_at, id__gte=cursor.pk
        )
    page = list(batches[: count + 1])
    data = [selectors.batch_body(b) for b in page[:count]]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(page) > count,
    }


def _batch(tenant: Any, public_id: str, *, param: str = "batch_id") -> BatchJob:
    """The tenant's batch ``public_id`` (named ``param`` in a refusal), else BatchNotFound."""
    text_checked(public_id, param=param)
    try:
        return selectors.batch_for_tenant(tenant=tenant, public_id=public_id)
    except BatchJob.DoesNotExist:
        raise BatchNotFound(f"no batch {public_id!r}", param=param) from None


def _retrieve(*, key: str | None, batch_id: str) -> dict[str, Any]:
    api_key = api_key_authenticated(key=key)
    return selectors.batch_body(_batch(api_key.tenant, batch_id))


def _cancel(*, key: str | None, batch_id: str) -> dict[str, Any]:
    api_key = api_key_authenticated(key=key)
    return selectors.batch_body(batch_cancel(batch=_batch(api_key.tenant, batch_id)))


def _results(*, key: str | None, batch_id: str, kind: str) -> str:
    api_key = api_key_authenticated(key=key)
    return "".join(selectors.result_lines(batch=_batch(api_key.tenant, batch_id), kind=kind))


@refusals_answered("GET", "POST")
async def batches(request: HttpRequest) -> HttpResponse:
    """``POST /v1/batches`` (submit) and ``GET /v1/batches`` (list, newest first)."""
    key = _bearer(request)
    if request.method == "GET":
        body = await db_call(
            _list, key=key, limit=request.GET.get("limit"), after=request.GET.get("after")
        )
    else:
        text, metadata = _submitted(request)
        body = await db_call(_create, key=key, text=text, metadata=metadata)
    return JsonResponse(body)


@refusals_answered("GET")
async def batch(request: HttpRequest, batch_id: str) -> HttpResponse:
    """``GET /v1/batches/{id}``."""
    return JsonResponse(await db_call(_retrieve, key=_bearer(request), batch_id=batch_id))


@refusals_answered("POST")
async def batch_cancel_view(request: HttpRequest, batch_id: str) -> HttpResponse:
    """``POST /v1/batches/{id}/cancel``."""
    return JsonResponse(await db_call(_cancel, key=_bearer(request), batch_id=batch_id))


def results_file(text: str, *, batch_id: str, kind: str) -> HttpResponse:
    """The ``kind`` file (``selectors.OUTPUT`` or ``ERRORS``) of batch ``batch_id``, a download."""
    response = HttpResponse(text, content_type=f"{JSONL}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{batch_id}_{kind}.jsonl"'
    return response


async def _results_response(request: HttpRequest, batch_id: str, kind: str) -> HttpResponse:
    text = await db_call(_results, key=_bearer(request), batch_id=batch_id, kind=kind)
    return results_file(text, batch_id=batch_id, kind=kind)


@refusals_answered("GET")
async def batch_output(request: HttpRequest, batch_id: str) -> HttpResponse:
    """``GET /v1/batches/{id}/output``: the answered items, JSONL."""
    return await _results_response(request, batch_id, selectors.OUTPUT)


@refusals_answered("GET")
async def batch_errors(request: HttpRequest, batch_id: str) -> HttpResponse:
    """``GET /v1/batches/{id}/errors``: the items not served, JSONL."""
    return await _results_response(request, batch_id, selectors.ERRORS)
