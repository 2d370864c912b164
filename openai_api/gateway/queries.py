"""What a client may ask of ``GET /v1/quotes`` and of OpenAI's usage and costs endpoints: the
queries as pydantic models, checked in their fields' order, each refusal a 400 or a 422 naming its
parameter (``refusals``); the OpenAPI document describes the parameters from them.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from decimal import Decimal
from functools import partial
from typing import Annotated, Any, Literal

from django.http import QueryDict
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationInfo, model_validator

from accounts.money import decimal_text
from accounts.selectors.usage import (
    BUCKET_WIDTHS,
    COST_GROUPS,
    DEFAULT_BUCKET_WIDTH,
    LATEST_UNIX_S,
    PAGE_LIMITS,
    USAGE_GROUPS,
    UsageQuery,
)
from openai_api.gateway.errors import InvalidValue, MalformedRequest
from openai_api.gateway.refusals import (
    LEFT_OUT_AS_NULL,
    MALFORMED,
    as_validator,
    refused,
    short,
    text_checked,
    validated,
)
from openai_api.gateway.validation import BidText, NonEmptyText, bid_parsed


def _query_field(check: Any, schema: Any, description: str) -> Any:
    """A query parameter: checked by ``check`` (``as_validator``), described by ``schema``."""
    validator = PlainValidator(as_validator(check), json_schema_input_type=schema)
    return Annotated[Any, validator, Field(description=description)]


def _one_of(name: str, value: str, choices: Collection[str]) -> str:
    """``value`` if it is one of ``choices``, else MalformedRequest naming ``name``."""
    if value not in choices:
        raise MalformedRequest(
            f"{name} must be one of {', '.join(choices)}, got {short(value)}", param=name
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
            f"{name} must be a whole number from 1 to {high:,}, got {short(value)}", param=name
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
            f"{name} is not a number (ASCII digits with an optional fraction): {short(value)}",
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

    model: _query_field(_quoted_model, NonEmptyText, "the market's model") = LEFT_OUT_AS_NULL
    ttft_s: _query_field(
        partial(_query_number, name="ttft_s", high=QUOTE_MAX_TTFT_S, closed=True),
        Annotated[float, Field(gt=0, le=QUOTE_MAX_TTFT_S)],
        "seconds to first token",
    ) = LEFT_OUT_AS_NULL
    probability: _query_field(
        partial(_query_number, name="probability", high=1.0, closed=False),
        Annotated[float, Field(gt=0, lt=1)],
        "the share of requests to meet ttft_s",
    ) = QUOTE_DEFAULT_PROBABILITY
    bid: _query_field(_query_bid, BidText, "dollars per second: the waits it buys are quoted") = (
        LEFT_OUT_AS_NULL
    )
    prompt_tokens: _query_field(
        partial(_query_count, name="prompt_tokens", high=QUOTE_MAX_PROMPT_TOKENS),
        Annotated[int, Field(ge=1, le=QUOTE_MAX_PROMPT_TOKENS)],
        "the prompt's length in tokens: the wait bound's credit is counted",
    ) = LEFT_OUT_AS_NULL

    @model_validator(mode="after")
    def _something_to_quote(self) -> QuoteQuery:
        if self.prompt_tokens is not None and self.bid is None:
            raise refused(
                MALFORMED,
                "prompt_tokens counts the wait bound's credit into the waits a bid buys: give "
                "bid too",
                "prompt_tokens",
            )
        if self.ttft_s is None and self.bid is None:
            raise refused(
                MALFORMED,
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
            f"{short(value)}",
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
                f"group_by must name fields among {', '.join(groups)}, got {short(name)}",
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


_UsageSeconds = Annotated[str, Field(pattern="^[0-9]+$")]
_LIMITS = ", ".join(f"{w}: {d} (at most {m})" for w, (d, m) in PAGE_LIMITS.items())


class UsageParams(BaseModel):
    """The query of ``GET /v1/organization/usage/completions`` and ``/costs`` (OpenAI's):
    ``start_time`` (Unix seconds, required), ``end_time`` (now unless given),
    ``bucket_width``, ``group_by`` (repeated, ``group_by[]`` or comma-separated, each a field
    of the endpoint's), ``limit`` and ``page``; checked in this order (context: ``now``, Unix
    seconds; ``groups``)."""

    model_config = ConfigDict(json_schema_extra={"required": ["start_time"]})

    start_time: _query_field(_start_time, _UsageSeconds, "Unix seconds, included") = (
        LEFT_OUT_AS_NULL
    )
    end_time: _query_field(_end_time, _UsageSeconds, "Unix seconds, excluded; now unless given") = (
        LEFT_OUT_AS_NULL
    )
    bucket_width: _query_field(
        _bucket_width, Literal[tuple(BUCKET_WIDTHS)], f"{DEFAULT_BUCKET_WIDTH} unless given"
    ) = DEFAULT_BUCKET_WIDTH
    group_by: _query_field(
        _group_by,
        list[Literal[tuple(USAGE_GROUPS)]],  # type: ignore[misc]
        "fields to group the results by (repeated, or comma-separated)",
    ) = ()
    limit: _query_field(_limit, _UsageSeconds, f"buckets per page, by bucket_width: {_LIMITS}") = (
        LEFT_OUT_AS_NULL
    )
    page: _query_field(_seconds, _UsageSeconds, "the next_page of the answer before") = (
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

    group_by: _query_field(
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
            raise MalformedRequest(f"{short(name)} is not a parameter of this endpoint", param=name)
    data = {**query.dict(), "group_by": query.getlist("group_by") + query.getlist("group_by[]")}
    return validated(model, data, {"groups": groups, "now": now}).query()
