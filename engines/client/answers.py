"""What the engine client sends (``generate_body``) and reads back (``meta_parsed``): SGLang's
``/generate`` body and ``meta_info``, with the auction's fields when the engine sends them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engines.contract.wire import CUSTOM_PARAMS, auction_params, auction_value


@dataclass(frozen=True)
class EngineMeta:
    """What an engine reported about a request. Counts in tokens, times in engine seconds,
    ``bid`` (the bid the engine read) in $/s, ``charge`` in dollars. The auction fields are None
    when the engine does not send them."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str | None  # "length", "stop", "abort", ... (None while running)
    bid: float | None = None
    charge: float | None = None
    round_id: str | None = None
    position: int | None = None
    ttft_s: float | None = None
    effective_bid: float | None = None
    planned_completion_s: float | None = None
    time_saved_s: float | None = None
    block: Mapping[str, Any] | None = None  # the subtree it waited in (a round record's)
    engine: str | None = None  # the engine (replica) that admitted it
    # Its place in line when it joined the queue (records.AdmittedRequest): 1 first, the
    # requests planned ahead of it, the requests waiting then.
    rank: int | None = None
    ahead: int | None = None
    queue_len: int | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class EngineOutput:
    """A finished, non-streamed generation."""

    text: str
    meta: EngineMeta


@dataclass(frozen=True)
class EngineChunk:
    """One streamed event: ``delta`` is the new text since the previous chunk."""

    delta: str
    meta: EngineMeta


def generate_body(
    *,
    rid: str,
    max_new_tokens: int,
    bid: float,
    text: str | None = None,
    input_ids: list[int] | None = None,
    sampling_params: Mapping[str, Any] | None = None,
    stream: bool = False,
    owner: str = "",
) -> dict[str, Any]:
    """The JSON body of ``POST /generate``: ``rid`` the request's id, ``bid`` in dollars per
    second of waiting and ``owner`` its tenant's tag, carried in
    ``sampling_params.custom_params`` (the engine contract's fields, ``wire.auction_params``,
    which replace any ``custom_params`` given)."""
    if (text is None) == (input_ids is None):
        raise ValueError("give exactly one of text and input_ids")
    if not rid:
        raise ValueError("a request id must be non-empty")
    sampling = dict(sampling_params or {})
    sampling["max_new_tokens"] = max_new_tokens
    sampling[CUSTOM_PARAMS] = auction_params(bid=bid, owner=owner, request_id=rid)
    prompt = {"text": text} if text is not None else {"input_ids": input_ids}
    return {"rid": rid, "sampling_params": sampling, "stream": stream, **prompt}


def meta_parsed(data: Mapping[str, Any]) -> EngineMeta:
    """The ``meta_info`` of an engine's answer; the auction fields may be missing."""
    info = data.get("meta_info")
    if not isinstance(info, dict):
        raise TypeError("the answer has no meta_info object")
    finish = info.get("finish_reason")
    if isinstance(finish, dict):
        finish = finish.get("type")
    return EngineMeta(
        prompt_tokens=_count(info.get("prompt_tokens")),
        cached_tokens=_count(info.get("cached_tokens")),
        completion_tokens=_count(info.get("completion_tokens")),
        finish_reason=finish if isinstance(finish, str) else None,
        bid=_finite(auction_value(info, "bid")),
        charge=_finite(auction_value(info, "charge")),
        round_id=round_id if isinstance(round_id := auction_value(info, "round_id"), str) else None,
        position=position if _is_int(position := auction_value(info, "position")) else None,
        ttft_s=_finite(info.get("ttft")),
        effective_bid=_finite(auction_value(info, "effective_bid")),
        planned_completion_s=_finite(auction_value(info, "planned_completion_s")),
        time_saved_s=_finite(auction_value(info, "time_saved_s")),
        block=block if isinstance(block := auction_value(info, "block"), dict) else None,
        engine=engine if isinstance(engine := auction_value(info, "engine"), str) else None,
        rank=_count_or_none(auction_value(info, "rank")),
        ahead=_count_or_none(auction_value(info, "ahead")),
        queue_len=_count_or_none(auction_value(info, "queue_len")),
        raw=info,
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> int:
    return value if _is_int(value) and value >= 0 else 0


def _count_or_none(value: Any) -> int | None:
    return value if _is_int(value) and value >= 0 else None


def _finite(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
