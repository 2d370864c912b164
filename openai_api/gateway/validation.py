"""What a tenant's program may send to ``/v1``, described once: pydantic models that check each
request (pydantic's core is compiled) and from which the OpenAPI document's schemas are
generated (``openapi.document``).

Wrong shapes (not JSON, not an object, a field of the wrong type, a missing field) are
:class:`MalformedRequest` (400); well-formed but unacceptable values (a negative or NaN bid,
``max_tokens`` out of range, no messages, ``n`` other than 1) are :class:`InvalidValue` (422).
Each field's refusal reads as its :class:`Says` annotation writes it, naming the field by its
path (``messages[0].role``); the first field refused, in the models' order, is the answer.
Numbers are parsed as ``Decimal`` so a bid keeps exactly the digits it was sent with; a bid
written as text is ASCII decimal (``accounts.money.DECIMAL_TEXT``), and a negative zero is zero.
Every string a client sends (in the body, a path, a query string) must be text PostgreSQL can
keep (``accounts.text``: no NUL, no lone surrogate; JSON at most 32 levels deep), else a 400
that names the field. A body nested past what Python's parser takes, or an integer with more
digits than Python reads, is a 400 in the gateway's words (the depth limit; the field), never
Python's ("maximum recursion depth exceeded", "Exceeds the limit (4300 digits)"). What JSON
Schema cannot say is in the field's description: a bid written as a string is checked for range
and decimal places by the gateway only; ``max_completion_tokens``, when given, makes
``max_tokens`` ignored; ``X-Request-Class`` and ``X-Bid`` are read beside the body. Unknown
fields are ignored (OpenAI's clients send some).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from functools import partial
from typing import Annotated, Any, Literal, TypeVar

from django.http import QueryDict
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic import field_validator as _field_validator
from pydantic_core import PydanticCustomError, core_schema

import mechanism
from accounts.money import MONEY_PLACES, QUANTUM, decimal_text
from accounts.selectors.usage import (
    BUCKET_WIDTHS,
    COST_GROUPS,
    DEFAULT_BUCKET_WIDTH,
    LATEST_UNIX_S,
    PAGE_LIMITS,
    USAGE_GROUPS,
    UsageQuery,
)
from accounts.text import MAX_JSON_DEPTH, json_problem, text_problem
from openai_api.gateway.errors import GatewayError, InvalidValue, MalformedRequest

M = TypeVar("M", bound=BaseModel)
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
ROLES = tuple(sorted({"system", "developer", "user", "assistant", "tool"}))
_REQUEST_CLASS = re.compile(r"[A-Za-z0-9_.-]{1,50}")
# OpenAI features this gateway does not offer: asking for them is a 422, not a silent no-op.
_UNSUPPORTED = ("tools", "functions", "logprobs", "top_logprobs", "suffix", "response_format")
_SAMPLING = ("temperature", "top_p", "frequency_penalty", "presence_penalty")
# What a bid written as text may look like (money.DECIMAL_TEXT), in the error that refuses one.
BID_TEXT_FORMS = (
    "ASCII digits with an optional fraction and exponent, as in 0.01, 2 or 1e-2; "
    "spaces around it are ignored"
)
# accounts.money.DECIMAL_TEXT between ASCII spaces, a minus allowed on zero only (a negative bid
# is refused; "-0" bids 0): the schema's word for a bid written as text.
_UNSIGNED = r"[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?"
_ZERO = r"-?0+(\.0+)?([eE][+-]?[0-9]+)?"
BID_TEXT_PATTERN = rf"^[ \t\r\n]*({_ZERO}|{_UNSIGNED})[ \t\r\n]*$"


# --- how refusals read ------------------------------------------------------------------------

_MALFORMED, _INVALID = "malformed", "invalid"  # the refusals' kinds: 400 and 422
# pydantic's errors for a value of the wrong type, and how a field's type is named to the client.
_TYPE_NAMES = {"int_type": "an integer", "string_type": "a string", "bool_type": "a boolean",
               "dict_type": "an object", "model_type": "an object", "list_type": "an array",
               "float_type": "a number"}  # fmt: skip


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, Exception) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _refused(kind: str, says: str, param: str | None = None) -> PydanticCustomError:
    """A refusal for pydantic to place: ``says`` with ``{param}`` for the field's path;
    ``param`` when the error names something else (a header)."""
    return PydanticCustomError(kind, "{says}", {"says": says, "param": param})


@dataclass(frozen=True)
class Says:
    """How a field's refusals read (``{param}``: the field's path; ``{input}``: what was sent).

    A value the field's type refuses (or, with ``of``, that is not an instance of ``of``) is
    the 400 "{param} must be <kind>"; one of the right type that breaks the field's
    constraints is ``invalid``, a 422 (a 400 with ``malformed``); ``required``: null is "is
    required". A part refused in its own words (a nested field) is left as it is.
    """

    kind: str = ""
    invalid: str = ""
    of: type | None = None
    required: bool = False
    malformed: bool = False

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_wrap_validator_function(self._checked, handler(source))

    def _checked(self, value: Any, inner: Any) -> Any:
        if value is None and self.required:
            raise _refused(_MALFORMED, "{param} is required")
        if value is None:
            with contextlib.suppress(ValidationError):
                return inner(value)  # a field that may be null
        if self.of is not None and not _is(value, self.of):
            raise _refused(_MALFORMED, f"{{param}} must be {self.kind}")
        try:
            return inner(value)
        except ValidationError as exc:
            kinds = {e["type"] for e in exc.errors(include_url=False, include_input=False)}
            if kinds & {_MALFORMED, _INVALID}:
                raise
            if self.kind and self.of is None and kinds <= _TYPE_NAMES.keys():
                raise _refused(_MALFORMED, f"{{param}} must be {self.kind}") from None
            says = self.invalid.replace("{input}", _short(value))
            raise _refused(_MALFORMED if self.malformed else _INVALID, says) from None


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    if isinstance(value, bool) and kind is not bool:
        return False
    return isinstance(value, kind)


def _path(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def refusal(exc: ValidationError) -> GatewayError:
    """The gateway's error for the first refusal of a model's validation."""
    error = exc.errors(include_url=False)[0]
    where = _path(error["loc"])
    ctx = error.get("ctx") or {}
    if error["type"] in (_MALFORMED, _INVALID):
        kind = MalformedRequest if error["type"] == _MALFORMED else InvalidValue
        return kind(ctx["says"].replace("{param}", where), param=ctx["param"] or where)
    if error["type"] == "missing":
        return MalformedRequest(f"{where} is required", param=where)
    if error["type"] in _TYPE_NAMES:
        return MalformedRequest(f"{where} must be {_TYPE_NAMES[error['type']]}", param=where)
    return InvalidValue(f"{where}: {error['msg']}", param=where or None)


def validated(model: type[M], value: Any, context: Mapping[str, Any] | None = None) -> M:
    """``value`` checked by ``model`` (``context``: what its fields read beside it, such as
    headers); the gateway's error for the first refusal."""
    try:
        return model.model_validate(value, context=context)
    except ValidationError as exc:
        raise refusal(exc) from None


# --- JSON and text ----------------------------------------------------------------------------


class _LongInteger:
    """An integer in a body with more digits than Python turns into an ``int`` (its limit,
    4300 by default): kept as the digits' count, for the error that names its field."""

    __slots__ = ("digits",)

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))


def body_parsed(raw: bytes | str, *, what: str = "the body") -> dict[str, Any]:
    """The JSON object in ``raw`` (``what``: the body, a line); numbers with a fraction or
    exponent become ``Decimal``. One nested past what the parser takes, or with an integer too
    long to read, is refused in the project's words (the depth limit, the field), not Python's."""
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
            f"{what} is nested deeper than {MAX_JSON_DEPTH} arrays or objects"
        ) from None
    except ValueError as exc:  # bad UTF-8 or JSON
        raise MalformedRequest(f"{what} is not valid JSON: {_short(exc)}") from None
    if not isinstance(body, dict):
        raise MalformedRequest(f"{what} must be a JSON object")
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


# --- the bid ----------------------------------------------------------------------------------


def bid_parsed(value: Any, *, param: str) -> Decimal:
    """A bid in dollars per second: a JSON number or an ASCII decimal string, finite, in
    0..1e6, with at most 9 decimal places; -0 is 0. MalformedRequest for a wrong type,
    InvalidValue for a bad value."""
    if isinstance(value, bool) or not isinstance(value, int | Decimal | str):
        raise MalformedRequest(
            f"{param} must be a number or a decimal string (dollars per second)", param=param
        )
    try:
        bid = decimal_text(value) if isinstance(value, str) else Decimal(value)
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


def as_validator(check: Any) -> Any:
    """``check(value, info)`` as a validator (``info.context``: what is read beside the value,
    such as headers; ``info.data``: the fields checked before): a GatewayError it raises becomes
    the field's refusal (its own message and param)."""

    def validate(value: Any, info: ValidationInfo) -> Any:
        try:
            return check(value, info)
        except GatewayError as exc:
            kind = _MALFORMED if isinstance(exc, MalformedRequest) else _INVALID
            raise _refused(kind, exc.message, exc.param) from None

    return validate


def _body_bid(value: Any, info: ValidationInfo) -> Decimal | None:
    body_bid = None if value is None else bid_parsed(value, param="bid")
    in_header = (info.context or {}).get("x-bid")
    header_bid = None if in_header is None else bid_parsed(in_header, param="X-Bid")
    if body_bid is not None and header_bid is not None and body_bid != header_bid:
        raise InvalidValue(
            f"two different bids: {body_bid} in the body, {header_bid} in X-Bid", param="bid"
        )
    return body_bid if body_bid is not None else header_bid


def _request_class(value: Any, info: ValidationInfo) -> str:
    param, header = "request_class", (info.context or {}).get("x-request-class")
    if header is not None:
        value, param = header, "X-Request-Class"
    elif value is None:
        return DEFAULT_REQUEST_CLASS
    elif not isinstance(value, str):
        raise MalformedRequest("request_class must be a string", param=param)
    if not _REQUEST_CLASS.fullmatch(value.strip()):
        raise InvalidValue(f"{param} must be 1 to 50 letters, digits, '_', '.' or '-'", param=param)
    return value.strip()


# --- the completion bodies --------------------------------------------------------------------

BidNumber = Annotated[
    float,
    Field(
        ge=0,
        le=float(MAX_BID),
        description=f"dollars per second of waiting, 0..{MAX_BID:f}, at most {MONEY_PLACES} "
        "decimal places",
    ),
]
BidText = Annotated[
    str,
    Field(
        pattern=BID_TEXT_PATTERN,
        description=f"the same as a decimal string ({BID_TEXT_FORMS}); its range and "
        f"{MONEY_PLACES} places are checked by the gateway",
    ),
]
_Unsupported = Annotated[
    Literal[None, False, 0] | Annotated[list[Any], Field(max_length=0)],
    Says(invalid="{param} is not supported by this gateway"),
    Field(
        description="not supported by this gateway: a value other than null, false, 0 or [] "
        "is refused (422)"
    ),
]
_MaxTokens = Annotated[
    int,
    Field(ge=1, le=MAX_TOKENS_LIMIT),
    Says("an integer", f"{{param}} must be in 1..{MAX_TOKENS_LIMIT}, got {{input}}"),
]


def _sampling(low: float, high: float) -> Any:
    return Annotated[
        float,
        Field(ge=low, le=high),
        Says("an integer or a number", f"{{param}} must be in {low:g}..{high:g}"),
    ]


# A required field whose absence is refused as null is (by its Says, in its own words): checked
# when left out; the models list it as required in their schema.
LEFT_OUT_AS_NULL: Any = Field(default_factory=lambda: None, validate_default=True)


class _Strict(BaseModel):
    """JSON's types as they are (no "1" for 1, no 1 for true); unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Strict):
    include_usage: Annotated[bool, Says("a boolean")] | None = Field(
        default=None, description="a last chunk with usage and auction"
    )


class _Completion(_Strict):
    """The fields chat and text completions share, in the order they are checked."""

    model: Annotated[
        str,
        Field(min_length=1, pattern=r"\S"),
        Says(invalid="model must not be empty"),
        Field(max_length=MAX_MODEL_CHARS),
        Says(
            "a string", f"model is longer than {MAX_MODEL_CHARS} characters", of=str, required=True
        ),
        Field(description="the market's served model (GET /v1/models) or its slug"),
    ]
    tools: _Unsupported = None
    functions: _Unsupported = None
    logprobs: _Unsupported = None
    top_logprobs: _Unsupported = None
    suffix: _Unsupported = None
    response_format: _Unsupported = None
    n: Annotated[
        int | None, Field(ge=1, le=1), Says("an integer", "n must be 1: one completion per request")
    ] = Field(default=None, description="one completion per request")
    stream: bool | None = None
    stream_options: Annotated[StreamOptions, Says("an object")] | None = None
    max_completion_tokens: _MaxTokens | None = Field(
        default=None, description="wins over max_tokens when given"
    )
    max_tokens: _MaxTokens | None = None
    request_class: Annotated[
        str | None,
        PlainValidator(
            as_validator(_request_class),
            json_schema_input_type=Annotated[
                str | None, Field(pattern=rf"^\s*{_REQUEST_CLASS.pattern}\s*$")
            ],
        ),
    ] = Field(
        default=None,
        validate_default=True,
        description=f"The class the autobidder prices ({DEFAULT_REQUEST_CLASS} unless given); "
        "the header X-Request-Class wins over it. A class's autobid setting is a value in $/s "
        'of waiting, or a latency target {"ttft_s": T, "p": p}: the gateway then bids the '
        "market's quote for a first token within T seconds with probability p (GET "
        "/v1/quotes), never above the tenant's priority_bid_cap, paced by the autobidder.",
    )
    bid: Annotated[
        Decimal | None,
        PlainValidator(as_validator(_body_bid), json_schema_input_type=BidNumber | BidText | None),
    ] = Field(
        default=None,
        validate_default=True,
        description="What this request pays per second of waiting to be served sooner (dollars "
        "per second). Or the header X-Bid (the same value if both are sent). Without one, the "
        "service tier decides, else the tenant's autobidder, else 0. Wins over service_tier.",
    )
    temperature: _sampling(0.0, 2.0) | None = None
    top_p: _sampling(0.0, 1.0) | None = None
    frequency_penalty: _sampling(-2.0, 2.0) | None = None
    presence_penalty: _sampling(-2.0, 2.0) | None = None
    stop: Annotated[
        str | Annotated[list[str], Field(max_length=4)] | None,
        Says("a string or an array of strings", "stop takes at most 4 sequences"),
    ] = Field(default=None, description="up to 4 sequences that end the completion")
    seed: int | None = None
    user: str | None = None
    service_tier: Annotated[
        Literal[SERVICE_TIERS] | None,  # type: ignore[valid-type]
        Says(
            "a string",
            f"{{param}} must be one of {', '.join(SERVICE_TIERS)}, got {{input}}",
            of=str,
            malformed=True,
        ),  # fmt: skip
    ] = Field(
        default=None,
        description="OpenAI's tiers mapped onto bids: flex bids 0 (served when capacity "
        "allows, no priority charge); priority bids the market's quote for its priority target, "
        "capped by the tenant; auto and default keep the tenant's default (its autobidder, else "
        "0). The answer echoes the tier used.",
    )

    @_field_validator("max_tokens", mode="wrap")
    @classmethod
    def _ignored_beside_max_completion_tokens(
        cls, value: Any, inner: Any, info: ValidationInfo
    ) -> Any:
        return None if info.data.get("max_completion_tokens") is not None else inner(value)

    def params(self, endpoint: str, **more: Any) -> CompletionParams:
        """The checked request, as the gateway serves it."""
        sampling: dict[str, Any] = {n: v for n in _SAMPLING if (v := getattr(self, n)) is not None}
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        if stop:
            sampling["stop"] = stop
        return CompletionParams(
            endpoint=endpoint,
            model=self.model,
            max_tokens=self.max_completion_tokens
            or self.max_tokens
            or DEFAULT_MAX_TOKENS[endpoint],
            stream=bool(self.stream),
            include_usage=bool(self.stream_options and self.stream_options.include_usage),
            request_class=self.request_class,
            bid=self.bid,
            sampling=sampling,
            service_tier=self.service_tier or "auto",
            **more,
        )


def _content(value: Any, info: ValidationInfo) -> str:
    """A message's content flattened to text: a string, or text parts."""
    if value is None or isinstance(value, str):
        return value or ""
    if not isinstance(value, list):
        raise MalformedRequest("{param} must be a string or an array of parts")
    texts = []
    for j, part in enumerate(value):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise MalformedRequest(f"{{param}}[{j}] must be an object with a type")
        if part["type"] != "text":
            raise InvalidValue(f"{{param}}[{j}]: only text parts are supported")
        if not isinstance(part.get("text"), str):
            raise MalformedRequest(f"{{param}}[{j}].text must be a string")
        texts.append(part["text"])
    return "".join(texts)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    # A role left out is refused as one of the wrong type ("must be a string"), so it has a
    # default for pydantic, and is required in the schema.
    model_config = ConfigDict(json_schema_extra={"required": ["role"]})

    role: Annotated[
        Literal[ROLES],  # type: ignore[valid-type]
        Says("a string", f"{{param}} must be one of {', '.join(ROLES)}", of=str),
    ] = LEFT_OUT_AS_NULL
    content: Annotated[
        str | None,
        PlainValidator(as_validator(_content), json_schema_input_type=str | list[TextPart] | None),
    ] = None


class ChatCompletionRequest(_Completion):
    """``POST /v1/chat/completions``: OpenAI's body, plus ``bid`` and ``request_class``."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "demo/tiny-llm",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 64,
                    "bid": "0.01",
                },
                {
                    "model": "demo/tiny-llm",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "service_tier": "flex",
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            ]
        },
    )

    messages: Annotated[
        list[Annotated[ChatMessage, Says("an object")]],
        Field(min_length=1),
        Says("an array", "messages must not be empty", required=True),
    ]


def _prompt(value: Any, info: ValidationInfo) -> str | tuple[int, ...]:
    """One prompt: text or token ids (or a batch of one of either)."""
    if value is None:
        raise MalformedRequest("prompt is required")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # a batch of one
    if value in ("", []):
        raise InvalidValue("prompt must not be empty")
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(_is(t, int) for t in value):
        if not all(0 <= t <= MAX_TOKEN_ID for t in value):
            raise InvalidValue(f"token ids must be in 0..{MAX_TOKEN_ID}")
        return tuple(value)
    if isinstance(value, list) and all(isinstance(t, str | list) for t in value):
        raise InvalidValue("one prompt per request (batches are not supported)")
    raise MalformedRequest(
        "prompt must be a string, an array of one string or an array of token ids"
    )


_TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]], Field(min_length=1)]
_PromptText = Annotated[str, Field(min_length=1)]


class CompletionRequest(_Completion):
    """``POST /v1/completions``: one prompt (text or token ids), plus ``bid`` and
    ``request_class``."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "demo/tiny-llm",
                    "prompt": "Once upon a time",
                    "max_tokens": 16,
                    "bid": 0.002,
                    "request_class": "background",
                },
            ]
        },
    )

    prompt: Annotated[
        str | tuple[int, ...],
        PlainValidator(
            as_validator(_prompt),
            json_schema_input_type=_PromptText | _TokenIds | tuple[_PromptText] | tuple[_TokenIds],
        ),
        Field(description="text, token ids, or a batch of one of either"),
    ]


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


def completion_params(
    body: dict[str, Any], *, endpoint: str, headers: Mapping[str, str]
) -> CompletionParams:
    """Check a ``/v1/chat/completions`` or ``/v1/completions`` body and its headers.

    ``headers`` maps lower-case names to values (``x-bid``, ``x-request-class``).
    """
    if endpoint == CHAT:
        chat = validated(ChatCompletionRequest, body, headers)
        messages = tuple(Message(m.role, m.content or "") for m in chat.messages)
        return chat.params(endpoint, messages=messages)
    text = validated(CompletionRequest, body, headers)
    if isinstance(text.prompt, str):
        return text.params(endpoint, prompt_text=text.prompt)
    return text.params(endpoint, prompt_ids=text.prompt)


def _one_of(name: str, value: str, choices: Collection[str]) -> str:
    """``value`` if it is one of ``choices``, else MalformedRequest naming ``name``."""
    if value not in choices:
        raise MalformedRequest(
            f"{name} must be one of {', '.join(choices)}, got {_short(value)}", param=name
        )
    return value


# --- GET /v1/quotes ---------------------------------------------------------------------------

QUOTE_MAX_TTFT_S = 3600.0  # the longest wait a quote is asked for, seconds
QUOTE_DEFAULT_PROBABILITY = 0.9
QUOTE_MAX_PROMPT_TOKENS = 10_000_000  # a prompt longer than any engine's KV cache


def _quoted_model(value: Any, info: ValidationInfo) -> str:
    if not value:
        raise MalformedRequest("model is required (the model to be quoted)", param="model")
    return text_checked(value, param="model")


def _query_count(value: Any, info: ValidationInfo, *, name: str, high: int) -> int | None:
    """The query parameter ``name`` as a whole number in 1..high; None if absent."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= high:
        raise InvalidValue(
            f"{name} must be a whole number from 1 to {high:,}, got {_short(value)}", param=name
        )
    return int(value)


def _query_number(
    value: Any, info: ValidationInfo, *, name: str, high: float, closed: bool
) -> float | None:
    """The query parameter ``name`` as a number in (0, high] (``closed``) or (0, high); None if
    absent."""
    if value is None:
        return None
    try:
        number = float(decimal_text(value))
    except ValueError:
        raise InvalidValue(
            f"{name} is not a number (ASCII digits with an optional fraction): {_short(value)}",
            param=name,
        ) from None
    if not (0 < number < high or (closed and number == high)):
        bound = "at most" if closed else "below"
        raise InvalidValue(f"{name} must be above 0 and {bound} {high:g}, got {value}", param=name)
    return number


def _query_bid(value: Any, info: ValidationInfo) -> Decimal | None:
    return None if value is None else bid_parsed(value, param="bid")


class QuoteQuery(BaseModel):
    """``GET /v1/quotes``'s query: the market's model, and the wait to be quoted a bid for
    (``ttft_s`` seconds, met with ``probability``) and/or the bid to be quoted waits for, with
    the prompt's length in tokens when the wait bound's credit is to be counted."""

    model_config = ConfigDict(json_schema_extra={"required": ["model"]})

    model: Annotated[
        str,
        PlainValidator(as_validator(_quoted_model), json_schema_input_type=_PromptText),
        Field(description="the market's model"),
    ] = LEFT_OUT_AS_NULL
    ttft_s: Annotated[
        float | None,
        PlainValidator(
            as_validator(partial(_query_number, name="ttft_s", high=QUOTE_MAX_TTFT_S, closed=True)),
            json_schema_input_type=Annotated[float, Field(gt=0, le=QUOTE_MAX_TTFT_S)],
        ),
        Field(description="seconds to first token"),
    ] = LEFT_OUT_AS_NULL
    probability: Annotated[
        float,
        PlainValidator(
            as_validator(partial(_query_number, name="probability", high=1.0, closed=False)),
            json_schema_input_type=Annotated[float, Field(gt=0, lt=1)],
        ),
        Field(description="the share of requests to meet ttft_s"),
    ] = QUOTE_DEFAULT_PROBABILITY
    bid: Annotated[
        Decimal | None,
        PlainValidator(as_validator(_query_bid), json_schema_input_type=BidText),
        Field(description="dollars per second: the waits it buys are quoted"),
    ] = LEFT_OUT_AS_NULL
    prompt_tokens: Annotated[
        int | None,
        PlainValidator(
            as_validator(partial(_query_count, name="prompt_tokens", high=QUOTE_MAX_PROMPT_TOKENS)),
            json_schema_input_type=Annotated[int, Field(ge=1, le=QUOTE_MAX_PROMPT_TOKENS)],
        ),
        Field(description="the prompt's length in tokens: the wait bound's credit is counted"),
    ] = LEFT_OUT_AS_NULL

    @model_validator(mode="after")
    def _something_to_quote(self) -> QuoteQuery:
        if self.prompt_tokens is not None and self.bid is None:
            raise _refused(
                _MALFORMED,
                "prompt_tokens counts the wait bound's credit into the waits a bid buys: give "
                "bid too",
                "prompt_tokens",
            )
        if self.ttft_s is None and self.bid is None:
            raise _refused(
                _MALFORMED,
                "give ttft_s (seconds to first token: the bid that buys it is quoted) or bid "
                "(dollars per second: the waits it buys are quoted), or both",
                "ttft_s",
            )
        return self


# --- GET /v1/organization/usage/completions and /costs -----------------------------------------


def _seconds(value: Any, info: ValidationInfo) -> int | None:
    """A whole number of Unix seconds from 0 to ``LATEST_UNIX_S`` (ASCII digits); None if
    absent."""
    if value is None:
        return None
    name = info.field_name
    if not (
        value.isascii() and value.isdigit() and len(value) <= 15 and int(value) <= LATEST_UNIX_S
    ):
        raise MalformedRequest(
            f"{name} must be a whole number from 0 to {LATEST_UNIX_S} (ASCII digits), got "
            f"{_short(value)}",
            param=name,
        )
    return int(value)


def _start_time(value: Any, info: ValidationInfo) -> int:
    if value is None:
        raise MalformedRequest("start_time is required (Unix seconds)", param="start_time")
    return _seconds(value, info)  # type: ignore[return-value]


def _end_time(value: Any, info: ValidationInfo) -> int:
    end_time = (info.context or {})["now"] if value is None else _seconds(value, info)
    start_time = info.data.get("start_time")
    if start_time is not None and end_time <= start_time:
        raise MalformedRequest(
            f"end_time ({end_time}) must be after start_time ({start_time})", param="end_time"
        )
    return end_time


def _bucket_width(value: Any, info: ValidationInfo) -> str:
    return _one_of("bucket_width", value, BUCKET_WIDTHS)


def _group_by(value: Any, info: ValidationInfo) -> tuple[str, ...]:
    groups, group_by = (info.context or {})["groups"], []
    for name in (name for text in value for name in text.split(",")):
        if name.strip() not in groups:
            raise MalformedRequest(
                f"group_by must name fields among {', '.join(groups)}, got {_short(name)}",
                param="group_by",
            )
        if name.strip() not in group_by:
            group_by.append(name.strip())
    return tuple(group_by)


def _limit(value: Any, info: ValidationInfo) -> int | None:
    limit, width = _seconds(value, info), info.data.get("bucket_width", DEFAULT_BUCKET_WIDTH)
    if limit is not None and not 1 <= limit <= PAGE_LIMITS[width][1]:
        raise MalformedRequest(
            f"limit must be 1 to {PAGE_LIMITS[width][1]} buckets for bucket_width {width}, got "
            f"{limit}",
            param="limit",
        )
    return limit


def _usage_field(check: Any, schema: Any, description: str) -> Any:
    """A usage query parameter: checked by ``check``, described by ``schema``."""
    validator = PlainValidator(as_validator(check), json_schema_input_type=schema)
    return Annotated[Any, validator, Field(description=description)]


_UsageSeconds = Annotated[str, Field(pattern="^[0-9]+$")]
_LIMITS = ", ".join(f"{w}: {d} (at most {m})" for w, (d, m) in PAGE_LIMITS.items())


class UsageParams(BaseModel):
    """The query of ``GET /v1/organization/usage/completions`` and ``/costs`` (OpenAI's):
    ``start_time`` (Unix seconds, required), ``end_time`` (now unless given),
    ``bucket_width``, ``group_by`` (repeated, ``group_by[]`` or comma-separated, each a field
    of the endpoint's), ``limit`` and ``page``; checked in this order (context: ``now``, Unix
    seconds; ``groups``)."""

    model_config = ConfigDict(json_schema_extra={"required": ["start_time"]})

    start_time: _usage_field(_start_time, _UsageSeconds, "Unix seconds, included") = (
        LEFT_OUT_AS_NULL
    )
    end_time: _usage_field(_end_time, _UsageSeconds, "Unix seconds, excluded; now unless given") = (
        LEFT_OUT_AS_NULL
    )
    bucket_width: _usage_field(
        _bucket_width, Literal[tuple(BUCKET_WIDTHS)], f"{DEFAULT_BUCKET_WIDTH} unless given"
    ) = DEFAULT_BUCKET_WIDTH
    group_by: _usage_field(
        _group_by,
        list[Literal[tuple(USAGE_GROUPS)]],  # type: ignore[misc]
        "fields to group the results by (repeated, or comma-separated)",
    ) = ()
    limit: _usage_field(_limit, _UsageSeconds, f"buckets per page, by bucket_width: {_LIMITS}") = (
        LEFT_OUT_AS_NULL
    )
    page: _usage_field(_seconds, _UsageSeconds, "the next_page of the answer before") = (
        LEFT_OUT_AS_NULL
    )

    def query(self) -> UsageQuery:
        """The page asked for; MalformedRequest if ``page`` is not one of its window's."""
        asked = UsageQuery(
            start_time=self.start_time,
            end_time=self.end_time,
            bucket_width=self.bucket_width,
            group_by=self.group_by,
            limit=PAGE_LIMITS[self.bucket_width][0] if self.limit is None else self.limit,
        )
        page = self.page
        if page is not None and not (
            asked.first_bucket <= page < asked.end_time and page % asked.width_s == 0
        ):
            raise MalformedRequest(
                "page is not a page of this window and bucket_width: pass the next_page of the "
                "answer before, with the same start_time, end_time and bucket_width",
                param="page",
            )
        return replace(asked, page=page)


class CostsParams(UsageParams):
    """``GET /v1/organization/costs``' query: that of usage, grouped by the costs' fields."""

    group_by: _usage_field(
        _group_by,
        list[Literal[tuple(COST_GROUPS)]],  # type: ignore[misc]
        "fields to group the results by (repeated, or comma-separated)",
    ) = ()


def usage_params(
    query: QueryDict, *, model: type[UsageParams] = UsageParams, groups: Collection[str], now: int
) -> UsageQuery:
    """The page a usage query asks for (``model``'s fields, checked in their order);
    MalformedRequest (400) naming the parameter otherwise. A parameter it does not know
    (OpenAI's ``models``, ``project_ids`` filters) is refused, not ignored, so that no answer is
    silently wider than asked."""
    for name in query:
        if name not in model.model_fields and name != "group_by[]":
            raise MalformedRequest(
                f"{_short(name)} is not a parameter of this endpoint", param=name
            )
    data = {**query.dict(), "group_by": query.getlist("group_by") + query.getlist("group_by[]")}
    return validated(model, data, {"groups": groups, "now": now}).query()
