"""SGLang's native HTTP API as the simulated engine speaks it: request parsing and response bodies.

``POST /generate`` takes one request (SGLang's batch forms, lists of texts, are refused):
``text`` or ``input_ids``, ``sampling_params`` (``max_new_tokens``, default 128;
``custom_params``; other sampling parameters are type-checked loosely and otherwise ignored),
``stream`` and ``rid``. The bid ($/s of waiting) and the tenant's tag are read as the engine
contract says (``engines.contract.wire.auction_read``: ``custom_params.bid``, default 0,
and ``custom_params.tenant``); the request's id is the rid.

Errors are JSON ``{"error": {"message", "type", "code", "param"}}``: SGLang's own ``/generate``
answers ``{"error": {"message": ...}}``, so this is that shape with the OpenAI-style extras
(``code`` is the HTTP status, ``param`` the offending field or null). The aiohttp helpers at the
end (``errors_as_json``, ``json_error``, ``sse``) write these bodies and SGLang's SSE framing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from engines.contract.wire import CUSTOM_PARAMS, FieldError, auction_read

from .engine import SimRequest

log = logging.getLogger(__name__)

DEFAULT_MAX_NEW_TOKENS = 128
MAX_RID_CHARS = 256
MAX_TOKEN_ID = 2**31 - 1  # input_ids are accepted from any tokenizer's vocabulary
# Sampling parameters SGLang knows whose type is checked; all are otherwise ignored.
_NUMBER_PARAMS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
_INT_PARAMS = ("top_k", "min_new_tokens", "n")
_BOOL_PARAMS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


# A request the server refuses with 400; ``param`` names the offending field. The contract's
# error, so that a bid or a control body the contract refuses is one as it stands.
BadRequest = FieldError


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The JSON body of an error response."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "code": status, "param": param}}


@dataclass(frozen=True)
class GenerateRequest:
    """A checked ``/generate`` body: ``rid`` the request's id, ``bid`` in dollars per second of
    waiting, ``owner`` its tenant's tag ("": none)."""

    rid: str
    text: str | None
    input_ids: tuple[int, ...] | None
    max_new_tokens: int
    bid: float
    stream: bool
    owner: str = ""


def loads_json(raw: bytes) -> Any:
    """Parse a request body; BadRequest if it is not UTF-8 JSON."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad UTF-8, bad JSON, a 5000-digit number
        raise BadRequest(f"the body is not valid JSON: {exc}") from exc


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_generate(body: Any) -> GenerateRequest:
    """Check a ``/generate`` body; BadRequest naming the first bad field."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    text, ids = _prompt_of(body)
    sampling = body.get("sampling_params")
    if sampling is None:
        sampling = {}
    if not isinstance(sampling, dict):
        raise BadRequest("sampling_params must be an object", "sampling_params")
    max_new = _sampling_checked(sampling)
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", "stream")
    rid = _rid_of(body)
    auction = auction_read(sampling.get(CUSTOM_PARAMS), request_id=rid)  # BidError: a 400
    return GenerateRequest(rid, text, ids, max_new, auction.bid, stream, auction.owner)


def _prompt_of(body: dict[str, Any]) -> tuple[str | None, tuple[int, ...] | None]:
    """The body's prompt: (text, None) or (None, token ids)."""
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise BadRequest("give exactly one of text and input_ids", "text")
    if text is not None:
        if not isinstance(text, str):
            raise BadRequest("text must be a string (batch requests are not supported)", "text")
        if not text:
            raise BadRequest("text must not be empty", "text")
        return text, None
    if not isinstance(input_ids, list) or not input_ids:
        raise BadRequest("input_ids must be a non-empty list of token ids", "input_ids")
    if not all(_is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in input_ids):
        raise BadRequest(
            f"input_ids must hold integers in 0..{MAX_TOKEN_ID} (batch requests are not supported)",
            "input_ids",
        )
    return None, tuple(input_ids)


def _sampling_checked(sampling: dict[str, Any]) -> int:
    """Check ``sampling_params``' fields; its ``max_new_tokens`` (the default when absent)."""
    max_new = sampling.get("max_new_tokens")
    if max_new is None:
        max_new = DEFAULT_MAX_NEW_TOKENS
    if not _is_int(max_new) or max_new < 1:
        raise BadRequest(
            f"sampling_params.max_new_tokens must be an integer >= 1, got {max_new!r}",
            "sampling_params.max_new_tokens",
        )
    kinds = (
        (_NUMBER_PARAMS, "a number", lambda v: _is_number(v) and math.isfinite(v)),
        (_INT_PARAMS, "an integer", _is_int),
        (_BOOL_PARAMS, "a boolean", lambda v: isinstance(v, bool)),
    )
    for names, kind, valid in kinds:
        for name in names:
            value = sampling.get(name)
            if value is not None and not valid(value):
                raise BadRequest(
                    f"sampling_params.{name} must be {kind}", f"sampling_params.{name}"
                )
    if sampling.get("n") not in (None, 1):
        raise BadRequest(
            "sampling_params.n must be 1 (one sample per request)", "sampling_params.n"
        )
    stop = sampling.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise BadRequest(
            "sampling_params.stop must be a string or a list of strings", "sampling_params.stop"
        )
    return max_new


def _rid_of(body: dict[str, Any]) -> str:
    """The request's id: the body's ``rid``, or a new one."""
    rid = body.get("rid")
    if rid is None:
        rid = uuid.uuid4().hex
    if not isinstance(rid, str) or not rid or len(rid) > MAX_RID_CHARS:
        raise BadRequest(
            f"rid must be a non-empty string of at most {MAX_RID_CHARS} characters "
            "(batch requests are not supported)",
            "rid",
        )
    return rid


# --- responses --------------------------------------------------------------------------------


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A compact JSON response."""
    return web.json_response(body, status=status, headers=headers, dumps=dumps)


def dumps(obj: Any) -> str:
    """Compact JSON; NaN and infinities are refused (they are not JSON)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def json_error(status: int, message: str, param: str | None = None, **headers: str) -> web.Response:
    """An error response carrying ``error_body``."""
    return json_response(error_body(status, message, param), status, headers or None)


@web.middleware
async def errors_as_json(request: web.Request, handler) -> web.StreamResponse:
    """Every error is a JSON error body; bad input is never a 500."""
    try:
        return await handler(request)
    except BadRequest as exc:
        return json_error(400, str(exc), exc.param)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return json_error(exc.status, exc.reason if exc.text is None else exc.text)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unexpected error in %s %s", request.method, request.path)
        return json_error(500, "internal error in the simulated engine")


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as JSON, SGLang's stream framing."""
    return b"data: " + dumps(obj).encode() + b"\n\n"


def answer(req: SimRequest, generated: int, text: str) -> dict[str, Any]:
    """An answer's body after ``generated`` output tokens (``text`` theirs): SGLang's ``text``,
    ``output_ids`` and ``meta_info``, with the auction's fields in ``meta_info``.

    Times are engine seconds: ``queue_time`` is admission minus arrival, ``ttft`` first token
    minus arrival, ``e2e_latency`` (finished only) finish minus arrival. ``bid`` is $/s, ``charge``
    the priority charge in dollars, ``planned_completion_s`` and ``time_saved_s`` planned seconds
    from the admitting round.
    """
    finished = generated >= req.max_new_tokens
    info: dict[str, Any] = {
        "id": req.id,
        "finish_reason": {"type": "length", "length": generated} if finished else None,
        "prompt_tokens": len(req.tokens),
        "completion_tokens": generated,
        "cached_tokens": req.cached_tokens,
        "queue_time": None if req.admitted_at is None else req.admitted_at - req.arrival,
        "ttft": req.ttft,
        "bid": req.bid,
    }
    info.update(req.auction)
    if finished:
        info["e2e_latency"] = req.e2e
    return {"text": text, "output_ids": list(req.output[:generated]), "meta_info": info}
