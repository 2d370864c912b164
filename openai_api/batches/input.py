"""Checking a batch's input: OpenAI's batch line format, every body as its endpoint checks it.

A line is ``{"custom_id": "...", "method": "POST", "url": "/v1/chat/completions" or
"/v1/completions", "body": {...}}``; the body is what the endpoint takes, ``bid`` included
(dollars per second of waiting). The whole file is checked before anything is written: one bad
line refuses the file, and the error lists every bad line with its number (the first
``MAX_ERRORS_LISTED``). Streaming makes no sense in a batch and is refused. Every string of a
line (``custom_id``, the body's) must be text that can be kept (``refusals.body_parsed``).
A line is checked by ``BatchLineRequest``, its body by its endpoint's model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field

from openai_api.gateway.errors import GatewayError, InvalidValue, MalformedRequest
from openai_api.gateway.refusals import LEFT_OUT_AS_NULL, Says, body_parsed, text_checked, validated
from openai_api.gateway.validation import CHAT, COMPLETIONS, CompletionParams, completion_params

ENDPOINTS = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS}
MAX_CUSTOM_ID_CHARS = 512
MAX_ERRORS_LISTED = 100


def max_lines() -> int:
    """``BATCH_MAX_LINES``: the most lines a batch may have (default 10,000)."""
    return settings.BATCH_MAX_LINES


def max_bytes() -> int:
    """``BATCH_MAX_BYTES``: the largest input a batch may have, bytes (default 20 MiB)."""
    return settings.BATCH_MAX_BYTES


@dataclass(frozen=True)
class BatchLine:
    """One checked line. ``body`` is the JSON as sent (numbers as Python floats and ints: a
    float's shortest repr gives back the digits sent, for any bid the endpoint accepts)."""

    line: int  # 1-based
    custom_id: str
    url: str
    body: dict[str, Any]
    params: CompletionParams


class BatchInputInvalid(GatewayError):
    """400 (a malformed line) or 422 (a line with unacceptable values): the file is refused.
    ``lines`` lists each bad line: ``{"line", "message", "param", "code"}``."""

    code = "invalid_batch_input"

    def __init__(self, lines: list[dict[str, Any]], *, total_bad: int) -> None:
        first = lines[0]
        more = f" (and {total_bad - 1} more bad lines)" if total_bad > 1 else ""
        super().__init__(f"line {first['line']}: {first['message']}{more}", param=first["param"])
        self.status = 400 if any(e["status"] == 400 for e in lines) else 422
        self.lines = [{k: v for k, v in e.items() if k != "status"} for e in lines]
        self.total_bad = total_bad

    def body(self) -> dict[str, Any]:
        body = super().body()
        body["error"]["lines"] = self.lines
        body["error"]["bad_lines"] = self.total_bad
        return body


class BatchTooLarge(MalformedRequest):
    """413: more bytes or lines than a batch may have."""

    status = 413
    code = "batch_too_large"


def size_checked(size: int) -> None:
    """BatchTooLarge if an input of ``size`` bytes is larger than ``max_bytes()``."""
    if size > max_bytes():
        raise BatchTooLarge(f"the batch input is larger than {max_bytes()} bytes")


def input_decoded(raw: bytes) -> str:
    """The input as text: UTF-8 (a BOM is dropped), at most ``max_bytes()``."""
    size_checked(len(raw))
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise MalformedRequest(f"the batch input is not UTF-8: {exc}") from None


def lines_checked(text: str) -> list[BatchLine]:
    """Every non-blank line of ``text`` checked; BatchInputInvalid listing the bad ones."""
    text_checked(text, param="input")  # a NUL outside any line's JSON is refused here too
    size_checked(len(text.encode()))
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not numbered:
        raise InvalidValue("the batch input has no lines", param="input")
    if len(numbered) > max_lines():
        raise BatchTooLarge(
            f"a batch takes at most {max_lines()} lines, this one has {len(numbered)}"
        )
    checked: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for number, line in numbered:
        try:
            item = _line_checked(number, line)
            if item.custom_id in seen:
                raise InvalidValue(
                    f"custom_id {item.custom_id!r} is also on line {seen[item.custom_id]}; "
                    "each line needs its own",
                    param="custom_id",
                )
            seen[item.custom_id] = number
            checked.append(item)
        except GatewayError as exc:
            errors.append(
                {"line": number, "message": exc.message, "param": exc.param, "code": exc.code,
                 "status": exc.status}
            )  # fmt: skip
    if errors:
        raise BatchInputInvalid(errors[:MAX_ERRORS_LISTED], total_bad=len(errors))
    return checked


class BatchLineRequest(BaseModel):
    """One line of a batch's JSONL input; ``body`` as the endpoint takes it (no ``stream``)."""

    # Fields left out are refused as values of the wrong kind, as they always were, so they
    # have defaults for pydantic, and are required in the schema.
    model_config = ConfigDict(
        strict=True, extra="forbid", json_schema_extra={"required": ["custom_id", "url", "body"]}
    )

    custom_id: Annotated[
        str,
        Field(min_length=1, pattern=r"\S"),
        Says("a non-empty string", "{param} must be a non-empty string", of=str, malformed=True),
        Field(max_length=MAX_CUSTOM_ID_CHARS),
        Says(invalid=f"{{param}} is longer than {MAX_CUSTOM_ID_CHARS} characters"),
    ] = LEFT_OUT_AS_NULL
    method: Annotated[Literal["POST"], Says(invalid="{param} must be POST")] = "POST"
    url: Annotated[
        Literal[tuple(ENDPOINTS)],  # type: ignore[valid-type]
        Says(invalid=f"{{param}} must be one of {', '.join(ENDPOINTS)}, got {{input}}"),
    ] = LEFT_OUT_AS_NULL
    body: Annotated[dict[str, Any], Says("a JSON object")] = LEFT_OUT_AS_NULL


def _line_checked(number: int, line: str) -> BatchLine:
    raw = body_parsed(line, what="the line")
    unknown = sorted(set(raw) - BatchLineRequest.model_fields.keys())
    if unknown:  # first, as the whole line is then in doubt
        raise MalformedRequest(f"unknown field {unknown[0]!r}", param=unknown[0])
    checked = validated(BatchLineRequest, raw)
    params = _params_checked(checked.body, url=checked.url)
    # The body kept as JSON's own types (a float's shortest repr gives back the digits sent, for
    # any bid the endpoint accepts), as the endpoint is sent it when the batch runs.
    body = json.loads(json.dumps(checked.body, default=float))
    return BatchLine(
        line=number, custom_id=checked.custom_id, url=checked.url, body=body, params=params
    )


def body_params(body: dict[str, Any], *, url: str) -> CompletionParams:
    """A kept line's body checked again by the endpoint's own validation (its numbers read as
    Decimals); errors name the field as ``body.<field>``."""
    return _params_checked(body_parsed(json.dumps(body)), url=url)


def _params_checked(body: dict[str, Any], *, url: str) -> CompletionParams:
    try:
        params = completion_params(body, endpoint=ENDPOINTS[url], headers={})
    except GatewayError as exc:
        if exc.param:
            exc.param = f"body.{exc.param}"
        raise
    if params.stream:
        raise InvalidValue("stream is not supported in a batch", param="body.stream")
    return params
