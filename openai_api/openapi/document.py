"""The OpenAPI 3.1 document of everything under ``/v1`` (served at ``/v1/openapi.json``, rendered
at ``/docs/api/``): its JSON Schemas generated from the pydantic models that check the requests
(``gateway.validation``, ``batches``) and from ``answers``, its error codes from the gateway's
error classes (``gateway.errors`` and the few raised with a code of their own), each operation
listing the codes it can answer with, under their HTTP status.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from openai_api.batches.input import BatchInputInvalid, BatchLineRequest, BatchTooLarge
from openai_api.batches.services import BatchCreateRequest, BatchNotCancellable, BatchNotFound
from openai_api.gateway import errors as e
from openai_api.gateway.chat_templates import TemplateUnavailable
from openai_api.gateway.queries import CostsParams, QuoteQuery, UsageParams
from openai_api.gateway.validation import (
    MAX_BID,
    MAX_TOKENS_LIMIT,
    ChatCompletionRequest,
    CompletionRequest,
)
from openai_api.openapi import answers

REQUESTS = (ChatCompletionRequest, CompletionRequest, BatchCreateRequest, BatchLineRequest)

OPENAPI_VERSION = "3.1.0"
_REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class ErrorCode:
    """One ``error.code`` the API answers with, its HTTP status and OpenAI ``type``."""

    code: str
    status: int
    type: str
    when: str


def _code(
    kind: type[e.GatewayError], when: str, *, code: str | None = None, status: int | None = None
) -> ErrorCode:
    return ErrorCode(code or kind.code, status or kind.status, kind.type, when)


ERROR_CODES: tuple[ErrorCode, ...] = (
    _code(e.MalformedRequest, "the body is not JSON or a field has the wrong type or is missing"),
    _code(e.MalformedRequest, "the Host header is not in ALLOWED_HOSTS", code="invalid_host"),
    _code(
        e.MalformedRequest,
        "the engine refused the request (its message is passed on)",
        code="engine_rejected",
    ),
    _code(BatchInputInvalid, "a batch line is malformed (each bad line listed)", status=400),
    _code(BatchInputInvalid, "a batch line has an unacceptable value", status=422),
    _code(e.InvalidApiKey, "no API key, an unknown or a revoked one"),
    _code(e.NotFound, "no such endpoint", code="unknown_url"),
    _code(e.ModelNotFound, "no active market serves the model"),
    _code(BatchNotFound, "no such batch for this tenant"),
    _code(e.MethodNotAllowed, "the endpoint does not take this method"),
    _code(BatchNotCancellable, "the batch has already finished"),
    _code(e.BodyTooLarge, "the body is larger than the server takes"),
    _code(BatchTooLarge, "more bytes or lines than a batch may have"),
    _code(e.InvalidValue, "well-formed but unacceptable: a bad bid, max_tokens out of range, ..."),
    _code(
        e.BudgetExhaustedError,
        "the request's hold is more than a budget has left (error.budget.reason "
        "exceeds_remaining) or spent and held have used it up (used_up); error.budget has the "
        "figures; sent with x-should-retry: false and no Retry-After",
    ),
    _code(e.EngineBusy, "the engine's queue is full; Retry-After says when to try again"),
    _code(e.ServerError, "the gateway itself failed"),
    _code(e.EngineBidLost, "the engine did not read the bid sent; not charged"),
    _code(e.EngineDown, "the engine is down or failed; not charged"),
    _code(TemplateUnavailable, "the market's chat template cannot be loaded"),
    _code(e.DatabaseBusy, "a database lock was not had in time; Retry-After"),
    _code(e.DatabaseUnavailable, "the database could not be reached; Retry-After"),
    _code(e.EngineTimeout, "the engine went silent past its timeouts; not charged"),
)
BY_CODE: dict[str, list[ErrorCode]] = {}
for _entry in ERROR_CODES:
    BY_CODE.setdefault(_entry.code, []).append(_entry)

# Codes any /v1 answer may carry; each operation adds its own.
_EVERYWHERE = ("invalid_host", "invalid_api_key", "method_not_allowed", "internal_error")
_DATABASE = ("database_busy", "database_unavailable")
_COMPLETION_CODES = (
    "malformed_request",
    "engine_rejected",
    "invalid_value",
    "request_too_large",
    "model_not_found",
    "insufficient_quota",
    "queue_full",
    "engine_bid_lost",
    "engine_unavailable",
    "chat_template_unavailable",
    "engine_timeout",
    *_DATABASE,
)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=name)}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _error_responses(codes: tuple[str, ...]) -> dict[str, Any]:
    """One response per status among ``codes`` (and the codes every answer may carry), its
    schema an Error whose ``code`` is one of that status's."""
    by_status: dict[int, list[ErrorCode]] = {}
    for code in (*codes, *_EVERYWHERE):
        for entry in BY_CODE[code]:
            by_status.setdefault(entry.status, []).append(entry)
    responses = {}
    for status, entries in sorted(by_status.items()):
        names = sorted({entry.code for entry in entries})
        response: dict[str, Any] = {
            "description": "; ".join(f"`{x.code}`: {x.when}" for x in entries),
            "content": _json(
                {
                    "allOf": [
                        _ref("Error"),
                        {"properties": {"error": {"properties": {"code": {"enum": names}}}}},
                    ]
                }
            ),
        }
        headers = {}
        if {"queue_full", "database_busy", "database_unavailable"} & set(names):
            headers["Retry-After"] = {
                "description": "seconds to wait before a retry (queue_full, database_*)",
                "schema": {"type": "integer"},
            }
        if "insufficient_quota" in names:
            headers["x-should-retry"] = {
                "description": "false for insufficient_quota: waiting is no remedy",
                "schema": {"type": "string"},
            }
        if headers:
            response["headers"] = headers
        responses[str(status)] = response
    return responses


def _header(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": description,
        "schema": {"type": "string"},
    }


def _parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """The query parameters the fields of ``model`` describe."""
    schema = model.model_json_schema()
    return [
        _query(
            name, field, field.pop("description", ""), required=name in schema.get("required", [])
        )
        for name, field in schema["properties"].items()
    ]


def _query(
    name: str, schema: dict[str, Any], description: str, *, required: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema,
    }


_BATCH_ID = {"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}


_BUCKETS = (
    "Buckets are aligned to UTC minutes, hours or days and clipped to "
    "[`start_time`, `end_time`); a page holds `limit` of them, empty ones included; pass "
    "`next_page` as `page` (with the same window) for the next. An unknown parameter (OpenAI's "
    "`models`, `project_ids` filters) is refused, not ignored."
)


def _operation(
    operation_id: str,
    tag: str,
    summary: str,
    description: str,
    answer: str | dict[str, Any],
    codes: tuple[str, ...] = (),
    parameters: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One operation; ``answer``: the component its 200 answers with, or that answer itself."""
    if isinstance(answer, str):
        answer = {"description": answer, "content": _json(_ref(answer))}
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "summary": summary,
        "description": description,
        "tags": [tag],
        "responses": {"200": answer, **_error_responses(codes)},
    }
    if parameters:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = {"required": True, "content": body}
    return operation


_COMPLETION = (
    "OpenAI's endpoint with a bid. The gateway holds the request's worst case against the "
    "budgets, forwards it to the market's engine with its bid, settles the token and priority "
    "charges from the answer, and answers with OpenAI's shape plus `auction`. With `stream`, "
    "server-sent events of chunks end with `data: [DONE]`; the last chunk carries `usage` (with "
    "`stream_options.include_usage`) and `auction`; an error after the first event is sent as "
    'an event `{"error": {...}}`.'
)
_BID_HEADERS = [
    _header("X-Bid", f"the bid, dollars per second (0..{MAX_BID:f}; as the body's `bid`)"),
    _header("X-Request-Class", "the request class (as the body's `request_class`)"),
]


def _completion(endpoint: str, request: type[BaseModel], answer: str) -> dict[str, Any]:
    events = {"schema": {"type": "string", "description": f"`data: <{answer}Chunk>` events"}}
    content = {**_json(_ref(answer)), "text/event-stream": events}
    return _operation(
        endpoint.replace(".", "_") + "_create",
        "completions",
        f"Create a {endpoint.replace('.', ' ').replace('_', ' ')}",
        _COMPLETION,
        {"description": "the completion, or (with `stream`) its chunks", "content": content},
        _COMPLETION_CODES,
        _BID_HEADERS,
        _json(_ref(request.__name__)),
    )


_QUOTE = (
    "From the waits of the market's requests served recently, grouped by bid: the bid that "
    "bought a first token within `ttft_s` seconds with `probability`, by a margin clear of "
    "chance (0 when bidding nothing already gets there, else never below the reserve), and the "
    "waits `bid` buys. Give `ttft_s`, `bid` or both. While the market's wait bound is on "
    "(`wait_bound`), a request that has waited it ranks as if it bid more by a credit that "
    "grows with its prompt (never paid): with `prompt_tokens`, `waits.at_bound` says what the "
    "bid then ranks as and the waits of the bids it ranks among."
)
_USAGE = (
    "OpenAI's usage endpoint for the key's tenant (all of its keys): the served requests per "
    "bucket by the second they finished, their input tokens (cached ones included), cached "
    "input and output tokens. "
)
_COSTS = (
    "OpenAI's costs endpoint for the key's tenant: the ledger's charges per bucket by the "
    "second they were charged, in exact dollars (a decimal string, where OpenAI sends a "
    "number); grouped by `line_item`, the token charges (`tokens`) and the auction's priority "
    "charges (`priority`) apart. "
)
_BATCH_SUBMIT = (
    "The JSONL itself (a `BatchLineRequest` per line; `application/jsonl` or `text/plain`), or "
    "JSON. The whole file is checked first, each line's body by its endpoint's rules; a bad "
    "file is refused whole."
)
_BATCH_LIST = [
    _query(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": 100},
        "batches per page, 20 unless given",
    ),
    _query("after", {"type": "string"}, "the last batch id of the page before"),
]
_JSONL = {"application/jsonl": {"schema": {"type": "string"}}}
_BATCH = ("malformed_request", "batch_not_found", *_DATABASE)


def _paths() -> dict[str, Any]:
    batch_files = {
        f"/v1/batches/{{batch_id}}/{kind}": {
            "get": _operation(
                f"batch_{kind}",
                "batches",
                f"A batch's {kind} file",
                f"JSONL, a `BatchResultLine` per {what}.",
                {"description": "JSONL", "content": _JSONL},
                _BATCH,
                [_BATCH_ID],
            )
        }
        for kind, what in (("output", "answered line"), ("errors", "line not served"))
    }
    reference = {
        "operationId": "openapi_read",
        "summary": "This document",
        "tags": ["reference"],
        "security": [],
        "responses": {
            "200": {"description": "OpenAPI 3.1", "content": _json({"type": "object"})},
            **{k: r for k, r in _error_responses(()).items() if k != "401"},
        },
    }
    submitted = {
        **_json(_ref("BatchCreateRequest")),
        **_JSONL,
        "text/plain": _JSONL["application/jsonl"],
    }
    return {
        "/v1/chat/completions": {
            "post": _completion("chat.completion", ChatCompletionRequest, "ChatCompletion")
        },
        "/v1/completions": {
            "post": _completion("text_completion", CompletionRequest, "TextCompletion")
        },
        "/v1/models": {
            "get": _operation(
                "models_list",
                "markets",
                "List the models served",
                "One entry per active market, its served model as the `id`.",
                "ModelList",
                _DATABASE,
            )
        },
        "/v1/quotes": {
            "get": _operation(
                "quote_read",
                "markets",
                "Quote what a bid buys",
                _QUOTE,
                "Quote",
                ("malformed_request", "invalid_value", "model_not_found", *_DATABASE),
                _parameters(QuoteQuery),
            )
        },
        "/v1/budgets": {
            "get": _operation(
                "budgets_list",
                "budgets",
                "The budgets this key's requests must fit",
                "The tenant's budgets, then the key's own: spent, held and left in their current "
                "window; and the tenant's spend this UTC month.",
                "BudgetList",
                _DATABASE,
            )
        },
        "/v1/organization/usage/completions": {
            "get": _operation(
                "usage_completions",
                "usage",
                "The tenant's tokens and requests per time bucket",
                _USAGE + _BUCKETS,
                "UsageCompletionsPage",
                ("malformed_request", *_DATABASE),
                _parameters(UsageParams),
            )
        },
        "/v1/organization/costs": {
            "get": _operation(
                "costs",
                "usage",
                "The tenant's charges per time bucket",
                _COSTS + _BUCKETS,
                "CostsPage",
                ("malformed_request", *_DATABASE),
                _parameters(CostsParams),
            )
        },
        "/v1/batches": {
            "get": _operation(
                "batches_list",
                "batches",
                "List the tenant's batches, newest first",
                "A page of batches; `after` a batch id continues the list.",
                "BatchList",
                _BATCH,
                _BATCH_LIST,
            ),
            "post": _operation(
                "batch_create",
                "batches",
                "Submit a batch",
                _BATCH_SUBMIT,
                "Batch",
                (
                    "malformed_request",
                    "invalid_batch_input",
                    "invalid_value",
                    "batch_too_large",
                    *_DATABASE,
                ),
                body=submitted,
            ),
        },
        "/v1/batches/{batch_id}": {
            "get": _operation(
                "batch_read",
                "batches",
                "A batch",
                "The batch object.",
                "Batch",
                _BATCH,
                [_BATCH_ID],
            )
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": _operation(
                "batch_cancel",
                "batches",
                "Cancel a batch",
                "Pending lines are cancelled; lines in flight finish.",
                "Batch",
                (*_BATCH, "batch_not_cancellable"),
                [_BATCH_ID],
            )
        },
        **batch_files,
        "/v1/openapi.json": {"get": reference},
    }


def _description() -> str:
    rows = "\n".join(
        f"| {x.status} | `{x.code}` | `{x.type}` | {x.when} |"
        for x in sorted(ERROR_CODES, key=lambda x: (x.status, x.code))
    )
    return (
        "The market's OpenAI-compatible API. Every request carries a **bid**: dollars per "
        "second of waiting its owner pays to be served sooner (`bid` in the body or `X-Bid`), "
        "or OpenAI's `service_tier` (`flex` bids 0, `priority` the market's quote), or leaves "
        "it to the tenant's autobidder. Each answer says what was bid and charged in "
        f"`auction`. `max_tokens` is at most {MAX_TOKENS_LIMIT}.\n\n"
        "Authenticate with `Authorization: Bearer <API key>`. Money is exact decimal strings; "
        "integers are written without a fraction (`1`, not `1.0`). Every error is "
        '`{"error": {"message", "type", "param", "code"}}`:\n\n'
        "| status | code | type | when |\n|---|---|---|---|\n" + rows
    )


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document (built once per process)."""
    _, schemas = models_json_schema(
        [(model, "validation") for model in (*REQUESTS, *answers.ANSWERS)],
        ref_template=_REF,
    )
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": "Inference market API", "version": "v1", "description": _description()},
        "tags": [
            {"name": "completions", "description": "chat and text completions, with bids"},
            {"name": "markets", "description": "the models served and what a bid buys"},
            {"name": "budgets", "description": "what a key may still spend"},
            {"name": "usage", "description": "what the tenant used and was charged, over time"},
            {"name": "batches", "description": "OpenAI's Batch API with bids"},
            {"name": "reference", "description": "this document"},
        ],
        "security": [{"apiKey": []}],
        "paths": _paths(),
        "components": {
            "schemas": schemas["$defs"],
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an API key of the tenant (im_...), from its API keys page",
                }
            },
        },
    }
