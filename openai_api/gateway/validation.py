"""Checking what a tenant's program sent: the JSON body, the bid, the headers.

Wrong shapes (not JSON, not an object, a field of the wrong type, a missing field) are
:class:`MalformedRequest` (400); well-formed but unacceptable values (a negative or NaN bid,
``max_tokens`` out of range, no messages, ``n`` other than 1) are :class:`InvalidValue` (422).
Numbers are parsed as ``Decimal`` so a bid keeps exactly the digits it was sent with; a bid
written as text is ASCII decimal (``accounts.money.DECIMAL_TEXT``), and a negative zero is zero.
Every string a client sends (in the body, a path, a query string) must be text PostgreSQL can
keep (``accounts.text``: no NUL, no lone surrogate; JSON at most 32 levels deep), else a 400
that names the field. A body nested past what Python's parser takes, or an integer with more
digits than Python reads, is a 400 in the gateway's words (the depth limit; the field), never
Python's ("maximum recursion depth exceeded", "Exceeds the limit (4300 digits)").
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from django.http import QueryDict

import mechanism
from accounts.money import MONEY_PLACES, QUANTUM, decimal_text
from accounts.selectors.usage import (
    BUCKET_WIDTHS,
    DEFAULT_BUCKET_WIDTH,
    LATEST_UNIX_S,
    PAGE_LIMITS,
    UsageQuery,
)
from accounts.text import MAX_JSON_DEPTH, json_problem, text_problem
from openai_api.gateway.errors import InvalidValue, MalformedRequest

CHAT = "chat"
COMPLETIONS = "completions"
# OpenAI's values of service_tier: auto and default (the tenant's default bid or autobidder),
# flex (bid 0: served when capacity allows, no priority charge), priority (the market's quote).
SERVICE_TIERS = ("auto", "default", "flex", "priority")
MAX_BID = Decimal(mechanism.MAX_BID)  # dollars per second: the mechanism's limit
MAX_TOKENS_LIMIT = 32_768  # largest max_tokens a request may ask for
DEFAULT_MAX_TOKENS = {CHAT: 256, COMPLETIONS: 16}  # OpenAI's completions default is 16
DEFAULT_REQUEST_CLASS = "interactive"
MAX_MODEL_CHARS = 256  # a market's served model or slug is far shorter: refused before lookup
MAX_TOKEN_ID = 2**31 - 1
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_REQUEST_CLASS = re.compile(r"[A-Za-z0-9_.-]{1,50}")
# OpenAI features this gateway does not offer: asking for them is a 422, not a silent no-op.
_UNSUPPORTED = ("tools", "functions", "logprobs", "top_logprobs", "suffix", "response_format")
# (name, lowest, highest) of the sampling parameters passed on to the engine.
_SAMPLING_RANGES = (
    ("temperature", 0.0, 2.0),
    ("top_p", 0.0, 1.0),
    ("frequency_penalty", -2.0, 2.0),
    ("presence_penalty", -2.0, 2.0),
)


@dataclass(frozen=True)
class Message:
    """One chat message, its content flattened to text."""

    role: str
    content: str


@dataclass(frozen=True)
class CompletionParams:
    """A checked chat or text completion request. ``bid`` in dollars per second of waiting."""

    endpoint: str  # CHAT or COMPLETIONS
    model: str
    max_tokens: int
    stream: bool
    include_usage: bool
    request_class: str
    bid: Decimal | None  # None: no explicit bid
    messages: tuple[Message, ...] = ()  # chat
    prompt_text: str | None = None  # completions, a text prompt
    prompt_ids: tuple[int, ...] | None = None  # completions, token ids
    sampling: dict[str, Any] = field(default_factory=dict)  # passed on to the engine
    # OpenAI's service_tier (SERVICE_TIERS): flex bids 0, priority bids the market's quote; an
    # explicit bid wins over it.
    service_tier: str = "auto"


class _LongInteger:
    """An integer in a body with more digits than Python turns into an ``int`` (its limit,
    4300 by default): kept as the digits' count, for the error that names its field."""

    __slots__ = ("digits",)

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))


def body_parsed(raw: bytes) -> dict[str, Any]:
    """The JSON object in ``raw``; numbers with a fraction or exponent become ``Decimal``. A
    body nested past what the parser takes, or with an integer too long to read, is refused in
    the project's words (the depth limit, the field), not Python's."""
    longs: list[_LongInteger] = []

    def integer(text: str) -> int | _LongInteger:
        try:
            return int(text)
        except ValueError:  # too many digits (the JSON scanner passes nothing else)
            longs.append(_LongInteger(text))
            return longs[-1]

    try:
        body = json.loads(raw, parse_float=Decimal, parse_constant=Decimal, parse_int=integer)
    except RecursionError:  # json's own recursion, far past MAX_JSON_DEPTH
        raise MalformedRequest(
            f"the body is nested deeper than {MAX_JSON_DEPTH} arrays or objects"
        ) from None
    except ValueError as exc:  # bad UTF-8 or JSON
        raise MalformedRequest(f"the body is not valid JSON: {_short(exc)}") from None
    if not isinstance(body, dict):
        raise MalformedRequest("the body must be a JSON object")
    json_checked(body)  # first: it bounds the depth the walk below goes to
    long = _long_integer(body) if longs else None
    if long is not None:
        where, digits = long
        raise MalformedRequest(
            f"{where} has too many digits ({digits}) for any number the API takes", param=where
        )
    return body


def _long_integer(body: dict[str, Any]) -> tuple[str, int] | None:
    """(the field's path, its digits) of the first integer too long to read, or None."""
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, _LongInteger):
            return where, item.digits
        if isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(item))))
        elif isinstance(item, dict):
            stack.extend(
                (v, f"{where}.{k}" if where else str(k)) for k, v in reversed(item.items())
            )
    return None


def json_checked(value: Any, *, path: str = "") -> None:
    """MalformedRequest naming the first field of the parsed JSON ``value`` (under ``path``)
    whose text cannot be kept (a NUL, a lone surrogate) or that is nested too deep."""
    problem = json_problem(value, path=path)
    if problem is not None:
        where, why = problem
        raise MalformedRequest(f"{where or 'the body'} {why}", param=where or None)


def text_checked(value: str, *, param: str) -> str:
    """``value`` (a path segment, a query parameter) if it is text that can be kept, else
    MalformedRequest naming ``param``."""
    problem = text_problem(value)
    if problem is not None:
        raise MalformedRequest(f"{param} {problem}", param=param)
    return value


# What a bid written as text may look like (money.DECIMAL_TEXT), in the error that refuses one.
BID_TEXT_FORMS = (
    "ASCII digits with an optional fraction and exponent, as in 0.01, 2 or 1e-2; "
    "spaces around it are ignored"
)


def bid_parsed(value: Any, *, param: str) -> Decimal:
    """A bid in dollars per second: a JSON number or an ASCII decimal string, finite, in
    0..1e6, with at most 9 decimal places; -0 is 0. MalformedRequest for a wrong type,
    InvalidValue for a bad value."""
    if isinstance(value, bool) or not isinstance(value, int | Decimal | str | float):
        raise MalformedRequest(
            f"{param} must be a number or a decimal string (dollars per second)", param=param
        )
    try:
        if isinstance(value, str):
            bid = decimal_text(value)
        elif isinstance(value, float):  # only from callers that parsed JSON themselves
            bid = Decimal(repr(value))
        else:
            bid = Decimal(value)
    except (ValueError, InvalidOperation):
        raise InvalidValue(
            f"{param} is not a decimal number ({BID_TEXT_FORMS}): {_short(value)}", param=param
        ) from None
    if bid.is_zero():
        bid = bid.copy_abs()  # "-0" and -0.0 bid nothing, as 0 does: no "-0.000000000" echoed
    if not bid.is_finite():
        raise InvalidValue(f"{param} must be finite, got {_short(value)}", param=param)
    if bid < 0:
        raise InvalidValue(f"{param} must not be negative, got {_short(value)}", param=param)
    if bid > MAX_BID:
        raise InvalidValue(
            f"{param} must be at most {MAX_BID} dollars per second, got {_short(value)}",
            param=param,
        )
    if bid != bid.quantize(QUANTUM):
        raise InvalidValue(
            f"{param} has more than {MONEY_PLACES} decimal places: {_short(value)}", param=param
        )
    return bid


def completion_params(
    body: dict[str, Any], *, endpoint: str, headers: dict[str, str]
) -> CompletionParams:
    """Check a ``/v1/chat/completions`` or ``/v1/completions`` body and its headers.

    ``headers`` maps lower-case names to values (``x-bid``, ``x-request-class``).
    """
    model = _required(body, "model", str)
    if not model.strip():
        raise InvalidValue("model must not be empty", param="model")
    if len(model) > MAX_MODEL_CHARS:
        raise InvalidValue(f"model is longer than {MAX_MODEL_CHARS} characters", param="model")
    for name in _UNSUPPORTED:
        if body.get(name) not in (None, False, [], 0):
            raise InvalidValue(f"{name} is not supported by this gateway", param=name)
    n = _optional(body, "n", int)
    if n is not None and n != 1:
        raise InvalidValue("n must be 1: one completion per request", param="n")
    stream = _optional(body, "stream", bool) or False
    options = _optional(body, "stream_options", dict) or {}
    include_usage = _optional(options, "include_usage", bool, prefix="stream_options.") or False
    max_tokens = _max_tokens(body, endpoint)
    params: dict[str, Any] = {
        "endpoint": endpoint,
        "model": model,
        "max_tokens": max_tokens,
        "stream": stream,
        "include_usage": include_usage,
        "request_class": _request_class(body, headers),
        "bid": _bid(body, headers),
        "sampling": _sampling(body),
        "service_tier": _service_tier(body),
    }
    if endpoint == CHAT:
        params["messages"] = _messages(body)
    else:
        params["prompt_text"], params["prompt_ids"] = _prompt(body)
    return CompletionParams(**params)


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, Exception) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _type_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", bool: "a boolean", dict: "an object",
             list: "an array", Decimal: "a number"}  # fmt: skip
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    if isinstance(value, bool) and kind is not bool:
        return False
    return isinstance(value, kind)


def _optional(body: dict[str, Any], name: str, kind: type | tuple[type, ...], prefix: str = ""):
    value = body.get(name)
    if value is None:
        return None
    if not _is(value, kind):
        param = prefix + name
        raise MalformedRequest(f"{param} must be {_type_name(kind)}", param=param)
    return value


def _required(body: dict[str, Any], name: str, kind: type | tuple[type, ...]):
    if body.get(name) is None:
        raise MalformedRequest(f"{name} is required", param=name)
    return _optional(body, name, kind)


def _max_tokens(body: dict[str, Any], endpoint: str) -> int:
    name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    value = _optional(body, name, int)
    if value is None:
        return DEFAULT_MAX_TOKENS[endpoint]
    if not 1 <= value <= MAX_TOKENS_LIMIT:
        raise InvalidValue(f"{name} must be in 1..{MAX_TOKENS_LIMIT}, got {value}", param=name)
    return value


def _request_class(body: dict[str, Any], headers: dict[str, str]) -> str:
    value = headers.get("x-request-class")
    param = "X-Request-Class"
    if value is None:
        value = _optional(body, "request_class", str)
        param = "request_class"
    if value is None:
        return DEFAULT_REQUEST_CLASS
    value = value.strip()
    if not _REQUEST_CLASS.fullmatch(value):
        raise InvalidValue(f"{param} must be 1 to 50 letters, digits, '_', '.' or '-'", param=param)
    return value


def _bid(body: dict[str, Any], headers: dict[str, str]) -> Decimal | None:
    in_body = body.get("bid")
    in_header = headers.get("x-bid")
    body_bid = None if in_body is None else bid_parsed(in_body, param="bid")
    header_bid = None if in_header is None else bid_parsed(in_header, param="X-Bid")
    if body_bid is not None and header_bid is not None and body_bid != header_bid:
        raise InvalidValue(
            f"two different bids: {body_bid} in the body, {header_bid} in X-Bid", param="bid"
        )
    return body_bid if body_bid is not None else header_bid


def _one_of(name: str, value: str, choices: Collection[str]) -> str:
    """``value`` if it is one of ``choices``, else MalformedRequest naming ``name``."""
    if value not in choices:
        raise MalformedRequest(
            f"{name} must be one of {', '.join(choices)}, got {_short(value)}", param=name
        )
    return value


def _service_tier(body: dict[str, Any]) -> str:
    value = _optional(body, "service_tier", str)
    return "auto" if value is None else _one_of("service_tier", value, SERVICE_TIERS)


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    sampling: dict[str, Any] = {}
    for name, low, high in _SAMPLING_RANGES:
        value = _optional(body, name, (int, Decimal))
        if value is None:
            continue
        if isinstance(value, Decimal) and not value.is_finite() or not low <= value <= high:
            raise InvalidValue(f"{name} must be in {low:g}..{high:g}", param=name)
        sampling[name] = float(value)
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise MalformedRequest("stop must be a string or an array of strings", param="stop")
        if len(stop) > 4:
            raise InvalidValue("stop takes at most 4 sequences", param="stop")
        if stop:
            sampling["stop"] = stop
    _optional(body, "seed", int)
    _optional(body, "user", str)
    return sampling


def _messages(body: dict[str, Any]) -> tuple[Message, ...]:
    messages = _required(body, "messages", list)
    if not messages:
        raise InvalidValue("messages must not be empty", param="messages")
    checked = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise MalformedRequest(f"{param} must be an object", param=param)
        role = message.get("role")
        if not isinstance(role, str):
            raise MalformedRequest(f"{param}.role must be a string", param=f"{param}.role")
        if role not in ROLES:
            raise InvalidValue(
                f"{param}.role must be one of {', '.join(sorted(ROLES))}", param=f"{param}.role"
            )
        checked.append(Message(role=role, content=_content(message.get("content"), param)))
    return tuple(checked)


def _content(content: Any, param: str) -> str:
    param = f"{param}.content"
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise MalformedRequest(f"{param} must be a string or an array of parts", param=param)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise MalformedRequest(f"{param}[{j}] must be an object with a type", param=param)
        if part["type"] != "text":
            raise InvalidValue(f"{param}[{j}]: only text parts are supported", param=param)
        if not isinstance(part.get("text"), str):
            raise MalformedRequest(f"{param}[{j}].text must be a string", param=param)
        texts.append(part["text"])
    return "".join(texts)


def _prompt(body: dict[str, Any]) -> tuple[str | None, tuple[int, ...] | None]:
    prompt = body.get("prompt")
    if prompt is None:
        raise MalformedRequest("prompt is required", param="prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if prompt in ("", []):
        raise InvalidValue("prompt must not be empty", param="prompt")
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and all(_is(t, int) for t in prompt):
        if not all(0 <= t <= MAX_TOKEN_ID for t in prompt):
            raise InvalidValue(f"token ids must be in 0..{MAX_TOKEN_ID}", param="prompt")
        return None, tuple(prompt)
    if isinstance(prompt, list) and all(isinstance(t, str | list) for t in prompt):
        raise InvalidValue("one prompt per request (batches are not supported)", param="prompt")
    raise MalformedRequest(
        "prompt must be a string, an array of one string or an array of token ids",
        param="prompt",
    )


# --- GET /v1/quotes ---------------------------------------------------------------------------

QUOTE_MAX_TTFT_S = 3600.0  # the longest wait a quote is asked for, seconds
QUOTE_DEFAULT_PROBABILITY = 0.9
QUOTE_MAX_PROMPT_TOKENS = 10_000_000  # a prompt longer than any engine's KV cache


@dataclass(frozen=True)
class QuoteParams:
    """``GET /v1/quotes``'s query: the market's model, and the wait to be quoted a bid for
    (``ttft_s`` seconds, met with ``probability``) and/or the bid to be quoted waits for, with
    the prompt's length in tokens when the wait bound's credit is to be counted."""

    model: str
    ttft_s: float | None
    probability: float
    bid: Decimal | None
    prompt_tokens: int | None = None


def quote_params(query: Mapping[str, str]) -> QuoteParams:
    """The query of ``GET /v1/quotes``; MalformedRequest or InvalidValue naming the parameter."""
    model = query.get("model")
    if not model:
        raise MalformedRequest("model is required (the model to be quoted)", param="model")
    text_checked(model, param="model")
    ttft_s = _query_number(query, "ttft_s", high=QUOTE_MAX_TTFT_S, high_included=True)
    probability = _query_number(query, "probability", high=1.0, high_included=False)
    bid = None if query.get("bid") is None else bid_parsed(query["bid"], param="bid")
    prompt_tokens = _query_count(query, "prompt_tokens", high=QUOTE_MAX_PROMPT_TOKENS)
    if prompt_tokens is not None and bid is None:
        raise MalformedRequest(
            "prompt_tokens counts the wait bound's credit into the waits a bid buys: give bid too",
            param="prompt_tokens",
        )
    if ttft_s is None and bid is None:
        raise MalformedRequest(
            "give ttft_s (seconds to first token: the bid that buys it is quoted) or bid "
            "(dollars per second: the waits it buys are quoted), or both",
            param="ttft_s",
        )
    return QuoteParams(
        model=model,
        ttft_s=ttft_s,
        probability=QUOTE_DEFAULT_PROBABILITY if probability is None else probability,
        bid=bid,
        prompt_tokens=prompt_tokens,
    )


def _query_count(query: Mapping[str, str], name: str, *, high: int) -> int | None:
    """The query parameter ``name`` as a whole number in 1..high; None if absent."""
    text = query.get(name)
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= high:
        raise InvalidValue(
            f"{name} must be a whole number from 1 to {high:,}, got {_short(text)}", param=name
        )
    return int(text)


def _query_number(
    query: Mapping[str, str], name: str, *, high: float, high_included: bool
) -> float | None:
    """The query parameter ``name`` as a number in (0, high] (or (0, high)); None if absent."""
    text = query.get(name)
    if text is None:
        return None
    try:
        value = float(decimal_text(text))
    except ValueError:
        raise InvalidValue(
            f"{name} is not a number (ASCII digits with an optional fraction): {_short(text)}",
            param=name,
        ) from None
    if not (0 < value < high or (high_included and value == high)):
        bound = "at most" if high_included else "below"
        raise InvalidValue(f"{name} must be above 0 and {bound} {high:g}, got {text}", param=name)
    return value


_USAGE_PARAMS = frozenset(
    {"start_time", "end_time", "bucket_width", "group_by", "group_by[]", "limit", "page"}
)


def usage_params(query: QueryDict, *, groups: Collection[str], now: int) -> UsageQuery:
    """The query of ``GET /v1/organization/usage/completions`` and ``/costs`` (OpenAI's):
    ``start_time`` (Unix seconds, required), ``end_time`` (``now`` unless given),
    ``bucket_width``, ``group_by`` (repeated, ``group_by[]`` or comma-separated, each one of
    ``groups``), ``limit`` and ``page``. MalformedRequest (400) naming the parameter otherwise;
    a parameter it does not know (OpenAI's ``models``, ``project_ids`` filters) is refused, not
    ignored, so that no answer is silently wider than asked."""
    for name in query:
        if name not in _USAGE_PARAMS:
            raise MalformedRequest(
                f"{_short(name)} is not a parameter of this endpoint", param=name
            )
    start_time = _unix_seconds(query, "start_time")
    if start_time is None:
        raise MalformedRequest("start_time is required (Unix seconds)", param="start_time")
    end_time = _unix_seconds(query, "end_time")
    end_time = now if end_time is None else end_time
    if end_time <= start_time:
        raise MalformedRequest(
            f"end_time ({end_time}) must be after start_time ({start_time})", param="end_time"
        )
    width = _one_of("bucket_width", query.get("bucket_width", DEFAULT_BUCKET_WIDTH), BUCKET_WIDTHS)
    group_by: list[str] = []
    for text in query.getlist("group_by") + query.getlist("group_by[]"):
        for name in text.split(","):
            if name.strip() not in groups:
                raise MalformedRequest(
                    f"group_by must name fields among {', '.join(groups)}, got {_short(name)}",
                    param="group_by",
                )
            if name.strip() not in group_by:
                group_by.append(name.strip())
    default, most = PAGE_LIMITS[width]
    limit = _unix_seconds(query, "limit")
    if limit is not None and not 1 <= limit <= most:
        raise MalformedRequest(
            f"limit must be 1 to {most} buckets for bucket_width {width}, got {limit}",
            param="limit",
        )
    asked = UsageQuery(
        start_time=start_time,
        end_time=end_time,
        bucket_width=width,
        group_by=tuple(group_by),
        limit=default if limit is None else limit,
    )
    page = _unix_seconds(query, "page")
    if page is not None and not (
        asked.first_bucket <= page < end_time and page % asked.width_s == 0
    ):
        raise MalformedRequest(
            "page is not a page of this window and bucket_width: pass the next_page of the "
            "answer before, with the same start_time, end_time and bucket_width",
            param="page",
        )
    return replace(asked, page=page)


def _unix_seconds(query: QueryDict, name: str) -> int | None:
    """The query parameter ``name`` as a whole number from 0 to ``LATEST_UNIX_S`` (ASCII
    digits); None if absent."""
    text = query.get(name)
    if text is None:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= 15 and int(text) <= LATEST_UNIX_S):
        raise MalformedRequest(
            f"{name} must be a whole number from 0 to {LATEST_UNIX_S} (ASCII digits), got "
            f"{_short(text)}",
            param=name,
        )
    return int(text)
