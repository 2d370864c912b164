"""The ``/v1`` API's request bodies as pydantic models, from which the OpenAPI document's JSON
Schemas are derived (``document``); nothing validates requests with them.

The gateway's checks stay the hand-written ``gateway.validation`` (its messages name each field
and tell 400 from 422, which a schema cannot); these models state the same rules as JSON Schema,
with the limits read from that module, and ``tests/openai_api/openapi/`` drives each
constraint against the gateway's validation and the running gateway, so the two cannot drift
apart. What JSON Schema cannot say is in the field's description: a bid written as a string is
checked for range and decimal places by the gateway only; ``max_completion_tokens``, when given,
makes ``max_tokens`` ignored; ``X-Request-Class`` and ``X-Bid`` are read beside the body.
Unknown fields are ignored, as the gateway does (OpenAI's clients send some).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from accounts.money import MONEY_PLACES
from openai_api.batches.input import MAX_CUSTOM_ID_CHARS
from openai_api.batches.services import (
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE_CHARS,
)
from openai_api.gateway import validation as v

# --- shared pieces ----------------------------------------------------------------------------

# accounts.money.DECIMAL_TEXT between ASCII spaces, a minus allowed on zero only (a negative bid
# is refused; "-0" bids 0).
_UNSIGNED = r"[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?"
_ZERO = r"-?0+(\.0+)?([eE][+-]?[0-9]+)?"
BID_TEXT_PATTERN = rf"^[ \t\r\n]*({_ZERO}|{_UNSIGNED})[ \t\r\n]*$"

BidNumber = Annotated[
    float,
    Field(
        ge=0,
        le=float(v.MAX_BID),
        description=f"dollars per second of waiting, 0..{v.MAX_BID:f}, at most {MONEY_PLACES} "
        "decimal places",
    ),
]
BidText = Annotated[
    str,
    Field(
        pattern=BID_TEXT_PATTERN,
        description=f"the same as a decimal string ({v.BID_TEXT_FORMS}); its range and "
        f"{MONEY_PLACES} places are checked by the gateway",
    ),
]
Bid = Annotated[
    BidNumber | BidText | None,
    Field(
        description="What this request pays per second of waiting to be served sooner (dollars "
        "per second). Or the header X-Bid (the same value if both are sent). Without one, the "
        "service tier decides, else the tenant's autobidder, else 0. Wins over service_tier.",
    ),
]
ServiceTier = Annotated[
    Literal[v.SERVICE_TIERS] | None,  # type: ignore[valid-type]
    Field(
        description="OpenAI's tiers mapped onto bids: flex bids 0 (served when capacity "
        "allows, no priority charge); priority bids the market's quote for its priority target, "
        "capped by the tenant; auto and default keep the tenant's default (its autobidder, else "
        "0). The answer echoes the tier used.",
    ),
]
RequestClass = Annotated[
    str | None,
    Field(
        pattern=rf"^\s*{v._REQUEST_CLASS.pattern}\s*$",  # spaces around it are dropped
        description=f"The class the autobidder prices ({v.DEFAULT_REQUEST_CLASS} unless given); "
        "the header X-Request-Class wins over it. A class's autobid setting is a value in $/s "
        'of waiting, or a latency target {"ttft_s": T, "p": p}: the gateway then bids the '
        "market's quote for a first token within T seconds with probability p (GET "
        "/v1/quotes), never above the tenant's priority_bid_cap, paced by the autobidder.",
    ),
]
MaxTokens = Annotated[int | None, Field(ge=1, le=v.MAX_TOKENS_LIMIT)]
Model = Annotated[
    str,
    Field(
        min_length=1,
        max_length=v.MAX_MODEL_CHARS,
        pattern=r"\S",
        description="the market's served model (GET /v1/models) or its slug",
    ),
]
Stop = Annotated[
    str | Annotated[list[str], Field(max_length=4)] | None,
    Field(description="up to 4 sequences that end the completion"),
]
Unsupported = Annotated[
    Literal[None, False, 0] | Annotated[list[Any], Field(max_length=0)],
    Field(
        description="not supported by this gateway: a value other than null, false, 0 or [] "
        "is refused (422)"
    ),
]
_RANGES = {name: (low, high) for name, low, high in v._SAMPLING_RANGES}


def _sampling(name: str) -> Any:
    low, high = _RANGES[name]
    return Field(default=None, ge=low, le=high)


class StreamOptions(BaseModel):
    include_usage: bool | None = Field(
        default=None, description="a last chunk with usage and auction"
    )


class _Completion(BaseModel):
    """The fields chat and text completions share."""

    model_config = ConfigDict(extra="allow")

    model: Model
    max_tokens: MaxTokens = None
    max_completion_tokens: MaxTokens = Field(
        default=None, description="wins over max_tokens when given"
    )
    n: Literal[1] | None = Field(default=None, description="one completion per request")
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = _sampling("temperature")
    top_p: float | None = _sampling("top_p")
    frequency_penalty: float | None = _sampling("frequency_penalty")
    presence_penalty: float | None = _sampling("presence_penalty")
    stop: Stop = None
    seed: int | None = None
    user: str | None = None
    bid: Bid = None
    service_tier: ServiceTier = None
    request_class: RequestClass = None
    tools: Unsupported = None
    functions: Unsupported = None
    logprobs: Unsupported = None
    top_logprobs: Unsupported = None
    response_format: Unsupported = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal[tuple(sorted(v.ROLES))]  # type: ignore[valid-type]
    content: str | list[TextPart] | None = None


class ChatCompletionRequest(_Completion):
    """``POST /v1/chat/completions``: OpenAI's body, plus ``bid`` and ``request_class``."""

    model_config = ConfigDict(
        extra="allow",
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

    messages: Annotated[list[Message], Field(min_length=1)]
    suffix: Unsupported = None


TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=v.MAX_TOKEN_ID)]], Field(min_length=1)]
PromptText = Annotated[str, Field(min_length=1)]


class CompletionRequest(_Completion):
    """``POST /v1/completions``: one prompt (text or token ids), plus ``bid`` and
    ``request_class``."""

    model_config = ConfigDict(
        extra="allow",
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
        PromptText | TokenIds | tuple[PromptText] | tuple[TokenIds],
        Field(description="text, token ids, or a batch of one of either"),
    ]
    suffix: Unsupported = None


class BatchLine(BaseModel):
    """One line of a batch's JSONL input; ``body`` as the endpoint takes it (no ``stream``)."""

    model_config = ConfigDict(extra="forbid")

    custom_id: Annotated[str, Field(min_length=1, max_length=MAX_CUSTOM_ID_CHARS, pattern=r"\S")]
    method: Literal["POST"] = "POST"
    url: Literal["/v1/chat/completions", "/v1/completions"]
    body: dict[str, Any]


Metadata = Annotated[
    dict[
        Annotated[str, Field(max_length=MAX_METADATA_KEY_CHARS)],
        Annotated[str, Field(max_length=MAX_METADATA_VALUE_CHARS)],
    ]
    | None,
    Field(max_length=MAX_METADATA_KEYS),
]


class BatchCreateRequest(BaseModel):
    """``POST /v1/batches`` as JSON; the JSONL itself may be sent instead (application/jsonl)."""

    model_config = ConfigDict(extra="allow")

    input: str = Field(description="the JSONL text, a BatchLine per line")
    metadata: Metadata = None


REQUESTS: tuple[type[BaseModel], ...] = (
    ChatCompletionRequest,
    CompletionRequest,
    BatchCreateRequest,
    BatchLine,
)
