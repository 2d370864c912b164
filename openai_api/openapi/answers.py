"""The ``/v1`` API's answers as pydantic models, from which the OpenAPI document's JSON Schemas
are derived (``document``): the shapes ``gateway.responses``, ``gateway.selectors`` and
``batches.selectors`` write. Unknown fields are forbidden, so an undocumented field in an answer
of the running gateway fails the tests (``tests/openai_api/openapi/test_answers.py``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from accounts.money import MONEY_PLACES

MONEY_TEXT = rf"^-?[0-9]+\.[0-9]{{{MONEY_PLACES}}}$"

Money = Annotated[
    str,
    Field(
        pattern=MONEY_TEXT,
        description=f"dollars, an exact decimal string with {MONEY_PLACES} places",
    ),
]
MoneyPerSecond = Annotated[
    str,
    Field(
        pattern=MONEY_TEXT,
        description=f"dollars per second of waiting, an exact decimal string ({MONEY_PLACES} "
        "places)",
    ),
]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptTokensDetails(_Answer):
    cached_tokens: int = Field(ge=0, description="prompt tokens found in the engine's KV cache")


class Usage(_Answer):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    prompt_tokens_details: PromptTokensDetails


class Auction(_Answer):
    """What the request bid and paid (``gateway.responses.auction_body``)."""

    bid: MoneyPerSecond
    effective_bid: MoneyPerSecond = Field(description="0 under the market's reserve")
    reserve: MoneyPerSecond
    bid_source: Literal["explicit", "autobid", "none", "tier"]
    rank: int | None = Field(
        ge=1,
        description="its place in line when it joined the engine's queue, 1 first (null when "
        "the engine does not report it)",
    )
    ahead: int | None = Field(ge=0, description="the waiting requests planned before it")
    round_id: str | None
    priority_charge: Money | None = Field(description="null when the engine reported none")
    priority_charge_capped_by: str | None = Field(
        description="the budget that cut the priority charge, if one did"
    )
    token_charge: Money | None


Tier = Literal["default", "flex", "priority"]
Finish = Literal["stop", "length"]


class AssistantMessage(_Answer):
    role: Literal["assistant"]
    content: str
    refusal: None


class ChatChoice(_Answer):
    index: Literal[0]
    message: AssistantMessage
    logprobs: None
    finish_reason: Finish


class TextChoice(_Answer):
    index: Literal[0]
    text: str
    logprobs: None
    finish_reason: Finish | None


class _CompletionAnswer(_Answer):
    id: str
    created: int = Field(description="Unix time, seconds")
    model: str
    service_tier: Tier = Field(description="the tier the request was served at")
    system_fingerprint: None


class ChatCompletion(_CompletionAnswer):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]
    usage: Usage
    auction: Auction


class TextCompletion(_CompletionAnswer):
    object: Literal["text_completion"]
    choices: list[TextChoice]
    usage: Usage
    auction: Auction


class ChunkDelta(_Answer):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(_Answer):
    index: Literal[0]
    delta: ChunkDelta
    logprobs: None
    finish_reason: Finish | None


class ChatCompletionChunk(_CompletionAnswer):
    """One server-sent event of a streamed chat completion; the last (with
    ``stream_options.include_usage``, else the one with the finish) has usage and auction."""

    object: Literal["chat.completion.chunk"]
    choices: list[ChunkChoice]
    usage: Usage | None = None
    auction: Auction | None = None


class TextCompletionChunk(_CompletionAnswer):
    object: Literal["text_completion"]
    choices: list[TextChoice]
    usage: Usage | None = None
    auction: Auction | None = None


class ModelEntry(_Answer):
    id: str = Field(description="the market's served model")
    object: Literal["model"]
    created: int
    owned_by: str
    market: str = Field(description="the market's slug")


class ModelList(_Answer):
    object: Literal["list"]
    data: list[ModelEntry]


class Budget(_Answer):
    object: Literal["budget"]
    budget_id: int
    scope: Literal["tenant", "key"]
    period: Literal["day", "week", "month", "none"]
    currency: Literal["usd"]
    limit: Money
    spent: Money
    held: Money = Field(description="reserved by requests in flight")
    remaining: Money = Field(description="limit - spent - held")
    window_start: str = Field(description="ISO 8601, UTC")
    resets_at: str | None = Field(description="ISO 8601, UTC; null for period none")
    seconds_until_reset: float | None = Field(description="seconds; null for period none")
    soft_alert: bool


class TenantMonth(_Answer):
    month_start: str = Field(description="ISO 8601, UTC")
    spent_this_month: Money
    held: Money


class BudgetList(_Answer):
    object: Literal["list"]
    data: list[Budget]
    tenant: TenantMonth


class QuoteBasis(_Answer):
    requests: int = Field(ge=0, description="requests served in the window")
    window_s: float = Field(description="seconds")


class QuoteTarget(_Answer):
    ttft_s: float = Field(description="seconds to first token")
    probability: float


class QuoteAtBound(_Answer):
    """What the bid ranks as once its request has waited the wait bound, and the waits of the
    recent bids it then ranks among."""

    after_s: float = Field(description="seconds of waiting: the wait bound in force")
    prompt_tokens: int = Field(ge=1, description="the prompt's length the credit is counted for")
    ranks_as: MoneyPerSecond = Field(
        description="the bid plus the credit earned by then (ranked as bid, never paid)"
    )
    bids_from: MoneyPerSecond
    bids_to: MoneyPerSecond
    requests: int = Field(ge=0)
    ttft_p50_s: float = Field(description="seconds, of the bids it then ranks among")
    ttft_p90_s: float = Field(description="seconds")
    ttft_p99_s: float = Field(description="seconds")


class QuoteWaits(_Answer):
    bid: MoneyPerSecond
    bids_from: MoneyPerSecond
    bids_to: MoneyPerSecond
    requests: int = Field(ge=0)
    ttft_p50_s: float = Field(description="seconds")
    ttft_p90_s: float = Field(description="seconds")
    ttft_p99_s: float = Field(description="seconds")
    at_bound: QuoteAtBound | None = Field(
        default=None,
        description="with prompt_tokens, while the wait bound is on: what the bid ranks as once "
        "it has waited the bound",
    )


class QuoteWaitBound(_Answer):
    """The market's wait bound in force: a request that has waited ``wait_s`` ranks as if it bid
    ``credit_per_1k_prompt_tokens`` more per 1,000 prompt tokens, reached in ``steps`` steps."""

    wait_s: float = Field(gt=0, description="seconds")
    source: Literal["auto", "pinned"] = Field(
        description="auto: set from the market's recent waits; pinned: by its operator"
    )
    steps: int = Field(ge=1)
    credit_per_1k_prompt_tokens: MoneyPerSecond


class Quote(_Answer):
    """``GET /v1/quotes`` (``gateway.selectors.quote_for``)."""

    object: Literal["quote"]
    model: str
    reserve: MoneyPerSecond
    based_on: QuoteBasis
    reason: str | None = Field(default=None, description="why a quote is missing")
    target: QuoteTarget | None = None
    bid: MoneyPerSecond | None = Field(
        default=None,
        description="the bid that bought the target: 0 or at least the reserve, never between; "
        "0 when bidding nothing already gets there (the requests that bought no priority, bid "
        "0 or under the reserve, met the target); null when no bid did (see reason)",
    )
    waits: QuoteWaits | None = Field(default=None, description="the waits the given bid buys")
    wait_bound: QuoteWaitBound | None = Field(
        description="the wait bound in force; null when it is off or the market's policy "
        "gives no credit (not a DFS auction)"
    )


_GROUP = "null unless grouped by it"


class _UsageGroups(_Answer):
    model: str | None = Field(description=f"the market's served model; {_GROUP}")
    market: str | None = Field(description=f"the market's slug; {_GROUP}")
    api_key_id: str | None = Field(description=f"the key's visible start, im_<prefix>; {_GROUP}")
    request_class: str | None = Field(description=f"the requests' class; {_GROUP}")


class UsageCompletionsResult(_UsageGroups):
    object: Literal["organization.usage.completions.result"]
    input_tokens: int = Field(ge=0, description="prompt tokens, cached ones included")
    input_cached_tokens: int = Field(ge=0, description="prompt tokens found in the KV cache")
    output_tokens: int = Field(ge=0)
    num_model_requests: int = Field(ge=0, description="requests served")


class CostAmount(_Answer):
    value: Money
    currency: Literal["usd"]


class CostsResult(_UsageGroups):
    object: Literal["organization.costs.result"]
    amount: CostAmount
    line_item: Literal["tokens", "priority"] | None = Field(
        description="the charge's kind: tokens (posted prices x tokens) or priority (the "
        f"auction's priority charge); {_GROUP}"
    )


class UsageCompletionsBucket(_Answer):
    object: Literal["bucket"]
    start_time: int = Field(description="Unix seconds, included")
    end_time: int = Field(description="Unix seconds, excluded")
    results: list[UsageCompletionsResult]


class CostsBucket(_Answer):
    object: Literal["bucket"]
    start_time: int = Field(description="Unix seconds, included")
    end_time: int = Field(description="Unix seconds, excluded")
    results: list[CostsResult]


class UsageCompletionsPage(_Answer):
    """``GET /v1/organization/usage/completions`` (``accounts.selectors.usage``)."""

    object: Literal["page"]
    data: list[UsageCompletionsBucket]
    has_more: bool
    next_page: str | None = Field(description="the page parameter of the next page; null last")


class CostsPage(_Answer):
    """``GET /v1/organization/costs`` (``accounts.selectors.usage``)."""

    object: Literal["page"]
    data: list[CostsBucket]
    has_more: bool
    next_page: str | None = Field(description="the page parameter of the next page; null last")


class BatchFailure(_Answer):
    code: str
    message: str


class BatchFailures(_Answer):
    object: Literal["list"]
    data: list[BatchFailure]


class RequestCounts(_Answer):
    total: int = Field(ge=0)
    completed: int = Field(ge=0)
    failed: int = Field(ge=0)
    cancelled: int = Field(ge=0)


class Batch(_Answer):
    """OpenAI's batch object, with result URLs instead of file ids; times Unix seconds."""

    id: str
    object: Literal["batch"]
    endpoint: str | None
    model: str | None
    status: Literal["validating", "in_progress", "completed", "failed", "cancelling", "cancelled"]
    errors: BatchFailures | None
    output_url: str
    errors_url: str
    created_at: int
    in_progress_at: int | None
    completed_at: int | None
    failed_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None


class BatchList(_Answer):
    object: Literal["list"]
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool


class BatchLineError(_Answer):
    code: str = Field(
        description="the error code the line's request got, or batch_cancelled, "
        "batch_failed, answer_lost"
    )
    message: str


class BatchResultResponse(_Answer):
    status_code: int
    request_id: str | None
    body: dict[str, Any] | None = Field(description="the endpoint's answer or error body")


class BatchResultLine(_Answer):
    """One JSONL line of ``/output`` or ``/errors``."""

    id: str
    custom_id: str
    response: BatchResultResponse | None
    error: BatchLineError | None


class BudgetRefusal(_Answer):
    """The budget that refused a request (``insufficient_quota``), in figures."""

    reason: Literal["exceeds_remaining", "used_up"] = Field(
        description="exceeds_remaining: the budget has room left, but this request's hold is "
        "more than it (lower the bid or max_tokens, or raise the budget); used_up: what was "
        "spent and is held leaves nothing (wait for requests in flight or the reset, or raise "
        "the budget)"
    )
    budget_id: int = Field(description="as in GET /v1/budgets")
    scope: Literal["tenant", "key"]
    period: Literal["day", "week", "month", "none"]
    limit: Money
    spent: Money = Field(description="charged in the current window")
    held: Money = Field(description="reserved by requests in flight")
    remaining: Money = Field(description="limit - spent - held, never below 0")
    needed: Money = Field(
        description="this request's hold: its prompt and max_tokens at the market's prices "
        "plus its bid times the market's hold horizon"
    )
    resets_at: str | None = Field(description="ISO 8601, UTC; null for period none")
    seconds_until_reset: float | None = Field(description="seconds; null for period none")


class ErrorDetail(_Answer):
    message: str
    type: str = Field(description="OpenAI's category: invalid_request_error, ...")
    param: str | None = Field(description="the field, header or parameter at fault")
    code: str = Field(description="the reason, one of the codes listed for the status")
    lines: list[dict[str, Any]] | None = Field(
        default=None, description="invalid_batch_input only: each bad line"
    )
    bad_lines: int | None = Field(default=None, description="invalid_batch_input only")
    budget: BudgetRefusal | None = Field(
        default=None, description="insufficient_quota only: the budget that refused, in figures"
    )


class Error(_Answer):
    error: ErrorDetail


ANSWERS: tuple[type[BaseModel], ...] = (
    ChatCompletion,
    TextCompletion,
    ChatCompletionChunk,
    TextCompletionChunk,
    ModelList,
    BudgetList,
    Quote,
    UsageCompletionsPage,
    CostsPage,
    Batch,
    BatchList,
    BatchResultLine,
    Error,
)
