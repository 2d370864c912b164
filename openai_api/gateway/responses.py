"""OpenAI's response shapes, with the market's ``auction`` object added.

Non-streamed: ``chat.completion`` and ``text_completion`` bodies. Streamed:
``chat.completion.chunk`` and ``text_completion`` chunks as server-sent events, closed by
``data: [DONE]``. ``usage`` has ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` and
``prompt_tokens_details.cached_tokens``. ``auction`` (money as decimal strings, dollars or
dollars per second of waiting):

- ``bid``, ``effective_bid`` (0 when the bid is under the reserve: it buys no priority),
  ``reserve``, ``bid_source`` (``explicit``, ``autobid``, ``none``);
- ``rank``: the request's place in line when it joined the engine's queue, 1 first: its place
  in the order planned by the first round that ordered it (the round that admitted it, when it
  was admitted at once); ``ahead``: the waiting requests that plan put before it (``rank`` - 1);
  both when the engine reports them (null otherwise); ``round_id``: the round that admitted it;
- ``priority_charge`` and ``token_charge``: the ledger's entries for this request, as settled
  (a charge the budget could not cover is cut, and says so in ``priority_charge_capped_by``);
  ``priority_charge`` is ``null`` when the engine reported none.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from accounts.ledger import Settled
from accounts.money import money_str
from engines.client import EngineMeta
from openai_api.gateway.validation import CHAT

DONE = b"data: [DONE]\n\n"
FINISH_REASONS = {"length": "length", "stop": "stop", "abort": "stop"}


def usage_body(meta: EngineMeta) -> dict[str, Any]:
    """OpenAI's usage object from the engine's counts (tokens)."""
    cached = min(meta.cached_tokens, meta.prompt_tokens)
    return {
        "prompt_tokens": meta.prompt_tokens,
        "completion_tokens": meta.completion_tokens,
        "total_tokens": meta.prompt_tokens + meta.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def auction_body(
    *,
    bid: Decimal,
    effective_bid: Decimal,
    reserve: Decimal,
    bid_source: str,
    meta: EngineMeta | None,
    settled: Settled | None,
) -> dict[str, Any]:
    """The answer's ``auction`` object (see the module's docstring)."""
    priority = settled.priority if settled is not None else None
    tokens = settled.tokens if settled is not None else None
    return {
        "bid": money_str(bid),
        "effective_bid": money_str(effective_bid),
        "reserve": money_str(reserve),
        "bid_source": bid_source,
        "rank": meta.rank if meta is not None else None,
        "ahead": meta.ahead if meta is not None else None,
        "round_id": meta.round_id if meta is not None else None,
        "priority_charge": None if priority is None else money_str(priority.amount),
        "priority_charge_capped_by": None if priority is None else priority.detail.get("capped_by"),
        "token_charge": None if tokens is None else money_str(tokens.amount),
    }


def finish_reason(meta: EngineMeta | None, *, max_tokens: int) -> str:
    """OpenAI's finish_reason for what the engine reported."""
    reason = FINISH_REASONS.get(meta.finish_reason or "") if meta is not None else None
    if reason is None:
        generated = meta.completion_tokens if meta is not None else 0
        reason = "length" if generated >= max_tokens else "stop"
    return reason


def _head(kind: str, response_id: str, created: int, model: str, service_tier: str) -> dict:
    """The fields every completion body and chunk opens with."""
    return {
        "id": response_id,
        "object": kind,
        "created": created,
        "model": model,
        "service_tier": service_tier,
        "system_fingerprint": None,
    }


def completion_body(
    *,
    endpoint: str,
    response_id: str,
    created: int,
    model: str,
    service_tier: str,
    text: str,
    finish: str,
    usage: dict[str, Any],
    auction: dict[str, Any],
) -> dict[str, Any]:
    """A ``chat.completion`` or ``text_completion`` body; ``service_tier`` the tier the request
    was served at, echoed as OpenAI does."""
    choice: dict[str, Any]
    if endpoint == CHAT:
        message = {"role": "assistant", "content": text, "refusal": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    return {
        **_head(kind, response_id, created, model, service_tier),
        "choices": [choice],
        "usage": usage,
        "auction": auction,
    }


def chunk_body(
    *,
    endpoint: str,
    response_id: str,
    created: int,
    model: str,
    service_tier: str,
    text: str | None = None,
    role: bool = False,
    finish: str | None = None,
    no_choices: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One streamed chunk: a text delta, the role (chat's first chunk), the finish, or (with
    ``no_choices``) the usage chunk. ``extra`` adds top-level fields (usage, auction)."""
    choice: dict[str, Any]
    if endpoint == CHAT:
        delta: dict[str, Any] = {}
        if role:
            delta = {"role": "assistant", "content": ""}
        elif text is not None:
            delta = {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    return {
        **_head(kind, response_id, created, model, service_tier),
        "choices": [] if no_choices else [choice],
        **(extra or {}),
    }


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as compact JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
