"""What a tenant's program may send to ``/v1/chat/completions`` and ``/v1/completions``,
described once: pydantic models that check each body (pydantic's core is compiled) and from which
the OpenAPI document's schemas are generated (``openapi.document``); the queries of the other
endpoints are ``queries``', and how a refusal reads is ``refusals``'.

Well-formed but unacceptable values (a negative or NaN bid, ``max_tokens`` out of range, no
messages, ``n`` other than 1) are 422s. Numbers are parsed as ``Decimal`` so a bid keeps exactly
the digits it was sent with; a bid written as text is ASCII decimal
(``accounts.money.DECIMAL_TEXT``), and a negative zero is zero. What JSON Schema cannot say is in
the field's description: a bid written as a string is checked for range and decimal places by the
gateway only; ``max_completion_tokens``, when given, makes ``max_tokens`` ignored;
``X-Request-Class`` and ``X-Bid`` are read beside the body. Unknown fields are ignored (OpenAI's
clients send some).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationInfo
from pydantic import field_validator as _field_validator

import mechanism
from accounts.money import MONEY_PLACES, QUANTUM, decimal_text
from openai_api.gateway.errors import InvalidValue, MalformedRequest
from openai_api.gateway.refusals import (
    LEFT_OUT_AS_NULL,
    Says,
    as_validator,
    is_of,
    short,
    validated,
)

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
            f"{param} is not a decimal number ({BID_TEXT_FORMS}): {short(value)}", param=param
        ) from None
    if bid.is_zero():
        bid = bid.copy_abs()  # "-0" and -0.0 bid nothing, as 0 does: no "-0.000000000" echoed
    if not bid.is_finite():
        raise InvalidValue(f"{param} must be finite, got {short(value)}", param=param)
    if bid < 0:
        raise InvalidValue(f"{param} must not be negative, got {short(value)}", param=param)
    if bid > MAX_BID:
        raise InvalidValue(
            f"{param} must be at most {MAX_BID} dollars per second, got {short(value)}",
            param=param,
        )
    if bid != bid.quantize(QUANTUM):
        raise InvalidValue(
            f"{param} has more than {MONEY_PLACES} decimal places: {short(value)}", param=param
        )
    return bid


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
    if isinstance(value, list) and all(is_of(t, int) for t in value):
        if not all(0 <= t <= MAX_TOKEN_ID for t in value):
            raise InvalidValue(f"token ids must be in 0..{MAX_TOKEN_ID}")
        return tuple(value)
    if isinstance(value, list) and all(isinstance(t, str | list) for t in value):
        raise InvalidValue("one prompt per request (batches are not supported)")
    raise MalformedRequest(
        "prompt must be a string, an array of one string or an array of token ids"
    )


_TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]], Field(min_length=1)]
NonEmptyText = Annotated[str, Field(min_length=1)]


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
            json_schema_input_type=(
                NonEmptyText | _TokenIds | tuple[NonEmptyText] | tuple[_TokenIds]
            ),
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
