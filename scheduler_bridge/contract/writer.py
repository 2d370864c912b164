"""The one writer of round records, used by both engines (the schema is ``records``).

A round is one prefill attempt of SGLang's scheduler: the waiting queue was ordered (one
Clearing), and the scheduler admitted some requests from its front. Each admitted request pays
the priority charge of that round's plan (DESIGN.md 4.5). Every ``book_interval_s`` seconds at
most, the record also carries the order book's subtrees (``market.mechanism.book``).
Engine-free: the SGLang plugin and the simulated engine both build their records here.

Units: bids in $/s of waiting, charges in dollars, times in seconds (``time`` is Unix time).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from market.mechanism import Clearing, RequestTree
from market.mechanism.book import subtree_book
from market.mechanism.requests import effective_bid
from scheduler_bridge.contract.records import SCHEMA, AdmittedRequest, RoundRecord, SubtreeSummary

BOOK_DEPTH = 2  # subtree levels in a record
BOOK_LIMIT = 32  # subtrees in a record
LABEL_TOKENS = 16  # tokens of a subtree's prefix that its label shows


@dataclass(frozen=True, slots=True)
class AdmittedInfo:
    """What the engine knows about an admitted request beyond the round's plan (tokens)."""

    request_id: str
    prompt_tokens: int
    cached_tokens: int  # found in the KV cache at admission


def token_label(tokens: Sequence[int]) -> str:
    """A label of leading token ids, when there is no tokenizer."""
    return " ".join(map(str, tokens[:8]))


def tokenizer_label(tokenizer: object) -> Callable[[Sequence[int]], str]:
    """A label function that decodes the prefix with the tokenizer, or falls back to ids."""

    def label(tokens: Sequence[int]) -> str:
        try:
            return tokenizer.decode(list(tokens), skip_special_tokens=False)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - a label is never worth an error
            return token_label(tokens)

    return label


class RoundRecorder:
    """Builds the round records of one engine: ids, sequence numbers, charges, the book."""

    def __init__(
        self,
        *,
        engine_id: str,
        market: str,
        book_interval_s: float | None,
        label: Callable[[Sequence[int]], str] = token_label,
    ) -> None:
        self.engine_id = engine_id
        self.market = market
        self.book_interval_s = book_interval_s
        self.label = label
        self._epoch = f"{int(time.time() * 1000):x}"
        self._seq = itertools.count(1)
        self._next_book = 0.0  # monotonic seconds

    def record(
        self, tree: RequestTree, clearing: Clearing, admitted: Sequence[AdmittedInfo], *, now: float
    ) -> RoundRecord:
        """The record of a round; call it while the tree is as the round cleared it."""
        want = {a.request_id for a in admitted}
        position: dict[str, int] = {}
        for i, rid in enumerate(clearing.order):
            if rid in want:
                position[rid] = i
                if len(position) == len(want):
                    break
        reserve = clearing.reserve
        entries: list[AdmittedRequest] = []
        for a in admitted:
            rid = a.request_id
            bid = tree.get(rid).bid
            entries.append(
                {
                    "request_id": rid,
                    "bid": bid,
                    "effective_bid": effective_bid(bid, reserve),
                    "position": position[rid],
                    "planned_completion_s": clearing.completion_at(position[rid]),
                    "time_saved_s": clearing.time_saved(rid),
                    "charge": clearing.charge(rid),
                    "prompt_tokens": a.prompt_tokens,
                    "cached_tokens": a.cached_tokens,
                }
            )
        seq = next(self._seq)
        return round_record(
            clearing,
            engine=self.engine_id,
            market=self.market,
            round_id=f"{self.engine_id}:{self._epoch}:{seq}",
            seq=seq,
            now=now,
            subtrees=self._book(tree, clearing),
            admitted=entries,
        )

    def _book(self, tree: RequestTree, clearing: Clearing) -> list[SubtreeSummary]:
        if self.book_interval_s is None:
            return []
        tick = time.monotonic()
        if tick < self._next_book:
            return []
        self._next_book = tick + self.book_interval_s
        return subtree_summaries(tree, clearing, self.label)


def round_record(
    clearing: Clearing,
    *,
    engine: str,
    market: str,
    round_id: str,
    seq: int,
    now: float,
    subtrees: list[SubtreeSummary],
    admitted: list[AdmittedRequest],
) -> RoundRecord:
    """The record of one round of either engine, around its admitted requests and its book."""
    return {
        "schema": SCHEMA,
        "engine": engine,
        "market": market,
        "round_id": round_id,
        "seq": seq,
        "time": now,
        "policy": clearing.policy,
        "reserve": clearing.reserve,
        "tokens_per_second": clearing.tokens_per_second,
        "waiting": len(clearing),
        "subtrees": subtrees,
        "admitted": admitted,
    }


def subtree_summaries(
    tree: RequestTree, clearing: Clearing, label: Callable[[Sequence[int]], str]
) -> list[SubtreeSummary]:
    """The round's order book as a record carries it, for either engine: ``BOOK_DEPTH`` levels,
    at most ``BOOK_LIMIT`` subtrees; call it while the tree is as the round cleared it."""
    rows = subtree_book(tree, clearing, max_depth=BOOK_DEPTH, limit=BOOK_LIMIT)
    return [
        {
            # A hash of the prefix: the same subtree has the same key in every engine's records.
            "key": f"{hash(tuple(row.prefix)) & 0xFFFFFFFFFFFF:012x}",
            "label": label(tuple(row.prefix[:LABEL_TOKENS])),
            "depth": row.depth,
            "prefix_tokens": len(row.prefix),
            "cached_tokens": row.cached_tokens,
            "requests": row.requests,
            "bid_sum": row.bid_sum,
            "bid_mean": row.bid_mean,
            "density": row.density,
            "rank": row.rank,
            "first_position": row.first_position,
        }
        for row in rows
    ]
