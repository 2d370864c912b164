"""The one writer of round records, used by both engines (the schema is ``records``).

A round is one prefill attempt of an engine's scheduler: the waiting queue was ordered (one
Clearing), and the scheduler admitted some requests from its front. Each admitted request pays the
priority charge of that round's plan (docs/mechanism.md, "Rounds and charging") and carries its
block, the top-level subtree it waited in ("why this rank") and its place in line when it joined the
queue (``rank``, ``ahead``, ``queue_len``: see ``RoundRecorder.placed``). Every ``book_interval_s``
seconds of the engine's clock at most, the record also carries the order book's subtrees
(``mechanism.book``), the waiting bids and, every ``QUEUE_INTERVAL_S`` at most and up to
``whatif.QUEUE_LIMIT`` waiting requests, the queue itself (``mechanism.whatif``: what the console's
reserve what-if clears again; about 70 bytes a waiting request).
Engine-free: the SGLang plugin and the simulated engine both build their records here, so both
write the same fields, ``epoch`` and ``block`` included.

Units: bids in $/s of waiting, charges in dollars, times in seconds of the engine's clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy

from engines.contract.records import (
    SCHEMA,
    AdmittedRequest,
    BlockInfo,
    RoundRecord,
    SubtreeSummary,
)
from mechanism import BID_SCALE, Clearing, RequestTree
from mechanism.book import block_of, subtree_book
from mechanism.requests import effective_bid
from mechanism.whatif import QUEUE_LIMIT, queue_snapshot

BOOK_DEPTH = 2  # subtree levels in a record
BOOK_LIMIT = 32  # subtrees in a record
LABEL_TOKENS = 16  # tokens of a subtree's prefix that its label shows
BOOK_BIDS = 1000  # waiting bids in a record with the book, at most
# The waiting queue in a record with the book at most this often (engine seconds): the market
# keeps one every 10 s (market.live.whatif), so more would only fill the stream.
QUEUE_INTERVAL_S = 5.0


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
            return str(tokenizer.decode(list(tokens), skip_special_tokens=False))  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - a label is never worth an error
            return token_label(tokens)

    return label


class RoundRecorder:
    """Builds the round records of one engine run: its epoch, sequence numbers, charges, blocks
    and the book. ``epoch`` tells one run of an engine from the next (a restart starts again at
    seq 1); it defaults to the start time in milliseconds, in hex."""

    def __init__(
        self,
        *,
        engine_id: str,
        market: str,
        book_interval_s: float | None,
        label: Callable[[Sequence[int]], str] = token_label,
        epoch: str | None = None,
    ) -> None:
        self.engine_id = engine_id
        self.market = market
        self.book_interval_s = book_interval_s
        self.label = label
        self.epoch = epoch if epoch is not None else f"{int(time.time() * 1000):x}"
        self.seq = 0  # the last round's
        self._next_book = 0.0  # engine seconds
        self.queue_interval_s = QUEUE_INTERVAL_S
        self._next_queue = 0.0  # engine seconds
        # Each waiting request's place in the first round that ordered it (position, 0 first)
        # and the requests in that round's queue. Taken when it is admitted, dropped if it
        # leaves. Two dicts of ints, not one of pairs: a dict of ints is no container the
        # garbage collector walks, and these hold every waiting request.
        self._places: dict[str, int] = {}
        self._queue_lens: dict[str, int] = {}

    def placed(self, clearing: Clearing, arrived: Iterable[str]) -> None:
        """Note where the round ``clearing`` put the requests ``arrived`` (those it is the first
        round to order): a request's ``rank`` is that place, counted from 1, and ``ahead`` the
        requests the plan put before it. The place at admission to the batch says little (the
        scheduler admits from the front: almost always the first few); the place when it joined
        the queue says how far back its bid and its subtree put it. Call it after every round
        that cleared, before the round admits; scans the order only as far as the last of them."""
        ids = [rid for rid in arrived if rid not in self._places]
        if ids:
            positions = clearing.positions(ids)
            self._places.update(positions)
            self._queue_lens.update(dict.fromkeys(positions, len(clearing)))

    def forget(self, request_id: str) -> None:
        """Drop a request's place: it left the queue without being admitted."""
        self._places.pop(request_id, None)
        self._queue_lens.pop(request_id, None)

    def record(
        self,
        tree: RequestTree,
        clearing: Clearing,
        admitted: Sequence[AdmittedInfo],
        *,
        now: float,
        seq: int | None = None,
    ) -> RoundRecord:
        """The record of a round (``seq``: the engine's count of rounds, or else the next after
        the last record's); call it while the tree is as the round cleared it."""
        if seq is None:
            self.seq += 1
            seq = self.seq
        position = clearing.positions(a.request_id for a in admitted)
        places, queue_lens = self._places, self._queue_lens
        reserve = clearing.reserve
        blocks: dict[Any, Any] = {}  # block_of's cache: one walk per top-level subtree
        entries: list[AdmittedRequest] = []
        for a in admitted:
            rid = a.request_id
            bid = tree.get(rid).bid
            block = block_of(tree, clearing, rid, blocks)
            block_info: BlockInfo = {
                "prefix_tokens": block.prefix_tokens,
                "requests": block.requests,
                "bid_mean": block.bid_mean,
                "density": block.density,
            }
            # Not placed (an engine that did not say it arrived): its place in this round.
            first = places.pop(rid, position[rid])
            queue_len = queue_lens.pop(rid, len(clearing))
            entry: AdmittedRequest = {
                "request_id": rid,
                "bid": bid,
                "effective_bid": effective_bid(bid, reserve),
                "position": position[rid],
                "planned_completion_s": clearing.completion_at(position[rid]),
                "time_saved_s": clearing.time_saved(rid),
                "charge": clearing.charge(rid),
                "prompt_tokens": a.prompt_tokens,
                "cached_tokens": a.cached_tokens,
                "block": block_info,
                "rank": first + 1,
                "ahead": first,
                "queue_len": queue_len,
            }
            if credit := tree.entries[rid].credit:  # the wait bound's, in bid ticks
                entry["age_credit"] = credit / BID_SCALE
            entries.append(entry)
        record: RoundRecord = {
            "schema": SCHEMA,
            "engine": self.engine_id,
            "market": self.market,
            "epoch": self.epoch,
            "round_id": f"{self.engine_id}:{self.epoch}:{seq}",  # unique across engines and runs
            "seq": seq,
            "time": now,
            "policy": clearing.policy,
            "reserve": clearing.reserve,
            "tokens_per_second": clearing.tokens_per_second,
            "waiting": len(clearing),
            "subtrees": [],
            "admitted": entries,
        }
        if self.book_interval_s is not None and now >= self._next_book:
            self._next_book = now + self.book_interval_s
            record["subtrees"] = subtree_summaries(tree, clearing, self.label)
            record["waiting_bids"] = waiting_bids(tree)
            if now >= self._next_queue and len(tree) <= QUEUE_LIMIT:
                self._next_queue = now + self.queue_interval_s
                record["queue"] = queue_snapshot(
                    tree,
                    overhead_tokens=clearing.overhead_tokens,
                    charge_scope=clearing.charge_scope,
                )
        return record


def subtree_summaries(
    tree: RequestTree, clearing: Clearing, label: Callable[[Sequence[int]], str]
) -> list[SubtreeSummary]:
    """The round's order book as a record carries it: ``BOOK_DEPTH`` levels, at most
    ``BOOK_LIMIT`` subtrees; call it while the tree is as the round cleared it."""
    rows = subtree_book(tree, clearing, max_depth=BOOK_DEPTH, limit=BOOK_LIMIT)
    summaries: list[SubtreeSummary] = []
    for row in rows:
        prefix = tuple(row.prefix)
        node = row.node
        parent = node.parent.end if node.parent is not None else 0  # the root's end is 0
        summaries.append(
            {
                "key": prefix_key(prefix),
                "label": label(prefix[:LABEL_TOKENS]),
                "parent": prefix_key(prefix[:parent]) if parent else "",
                "branch": label(prefix[parent : parent + LABEL_TOKENS]),
                "depth": row.depth,
                "prefix_tokens": len(prefix),
                "cached_tokens": row.cached_tokens,
                "requests": row.requests,
                "bid_sum": row.bid_sum,
                "bid_mean": row.bid_mean,
                "credit_sum": row.credit_sum,
                "density": row.density,
                "rank": row.rank,
                "first_position": row.first_position,
                "owners": row.owners,
            }
        )
    return summaries


def prefix_key(prefix: Sequence[int]) -> str:
    """A subtree's key: a hash of its prefix, so that the same subtree has the same key in every
    engine's records (the hash of a tuple of ints is the same in every process)."""
    return f"{hash(tuple(prefix)) & 0xFFFFFFFFFFFF:012x}"


def waiting_bids(tree: RequestTree, limit: int = BOOK_BIDS) -> list[float]:
    """The waiting requests' bids ($/s, ascending): all of them, or ``limit`` evenly spaced
    through them when more wait (the lowest and the highest always among them)."""
    # The tree's array of bids in ticks (floats, exact below 2**53), copied and sorted by numpy:
    # 10,000 bids in about a quarter of what Python's sort of them takes.
    ticks = numpy.array(tree.bid_ticks(), dtype=numpy.float64)
    ticks.sort()
    n = len(ticks)
    if n > limit:
        ticks = ticks[numpy.arange(limit) * (n - 1) // (limit - 1)]
    bids: list[float] = (ticks / BID_SCALE).tolist()
    return bids
