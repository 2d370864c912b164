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

import json
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from accounts.text import whole_number
from openai_api.batches import selectors, tasks
from openai_api.batches.input import BatchTooLarge, input_decoded, max_bytes
from openai_api.batches.services import BatchNotFound, batch_cancel, batch_create
from openai_api.gateway.db import db_call
from openai_api.gateway.errors import GatewayError, MalformedRequest
from openai_api.gateway.keys import api_key_authenticated
from openai_api.gateway.validation import json_checked, text_checked
from openai_api.gateway.views import _bearer, _error, _methods
from openai_api.models import BatchJob

DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 100
JSONL = "application/jsonl"


def _raw_body(request: HttpRequest) -> bytes:
    """The body, read past Django's DATA_UPLOAD_MAX_MEMORY_SIZE up to ``BATCH_MAX_BYTES``."""
    limit = max_bytes()
    length = request.META.get("CONTENT_LENGTH")
    if length and length.isdigit() and int(length) > limit:
        raise BatchTooLarge(f"the batch input is larger than {limit} bytes")
    raw = request.read(limit + 1)
    if len(raw) > limit:
        raise BatchTooLarge(f"the batch input is larger than {limit} bytes")
    return raw


def _submitted(request: HttpRequest) -> tuple[str, Any]:
    """(the JSONL text, the metadata) of a POST."""
    raw = _raw_body(request)
    content_type = request.content_type or ""
    if content_type != "application/json":
        return input_decoded(raw), None
    try:
        form = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise MalformedRequest(f"the body is not valid JSON: {exc}") from None
    json_checked(form)
    if not isinstance(form, dict) or not isinstance(form.get("input"), str):
        raise MalformedRequest(
            'a JSON body must be {"input": "<JSONL text>", "metadata": {...}}; or send the '
            f"JSONL itself as {JSONL}",
            param="input",
        )
    return form["input"], form.get("metadata")


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


@csrf_exempt
async def batches(request: HttpRequest) -> HttpResponse:
    """``POST /v1/batches`` (submit) and ``GET /v1/batches`` (list, newest first)."""
    try:
        _methods(request, "GET", "POST")
        key = _bearer(request)
        if request.method == "GET":
            body = await db_call(
                _list, key=key, limit=request.GET.get("limit"), after=request.GET.get("after")
            )
        else:
            text, metadata = _submitted(request)
            body = await db_call(_create, key=key, text=text, metadata=metadata)
    except GatewayError as exc:
        return _error(exc)
    return JsonResponse(body)


async def _batch_response(
    request: HttpRequest, method: str, call: Callable[..., dict[str, Any]], batch_id: str
) -> HttpResponse:
    """``call(key=, batch_id=)``'s batch object (on a database thread) as JSON, or the refusal."""
    try:
        _methods(request, method)
        body = await db_call(call, key=_bearer(request), batch_id=batch_id)
    except GatewayError as exc:
        return _error(exc)
    return JsonResponse(body)


@csrf_exempt
async def batch(request: HttpRequest, batch_id: str) -> HttpResponse:
    """``GET /v1/batches/{id}``."""
    return await _batch_response(request, "GET", _retrieve, batch_id)


@csrf_exempt
async def batch_cancel_view(request: HttpRequest, batch_id: str) -> HttpResponse:
    """``POST /v1/batches/{id}/cancel``."""
    return await _batch_response(request, "POST", _cancel, batch_id)


async def _results_response(request: HttpRequest, batch_id: str, kind: str) -> HttpResponse:
    try:
        _methods(request, "GET")
        text = await db_call(_results, key=_bearer(request), batch_id=batch_id, kind=kind)
    except GatewayError as exc:
        return _error(exc)
    response = HttpResponse(text, content_type=f"{JSONL}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{batch_id}_{kind}.jsonl"'
    return response


@csrf_exempt
async def batch_output(request: HttpRequest, batch_id: str) -> HttpResponse:
    """``GET /v1/batches/{id}/output``: the answered items, JSONL."""
    return await _results_response(request, batch_id, selectors.OUTPUT)


@csrf_exempt
async def batch_errors(request: HttpRequest, batch_id: str) -> HttpResponse:
    """``GET /v1/batches/{id}/errors``: the items not served, JSONL."""
    return await _results_response(request, batch_id, selectors.ERRORS)
