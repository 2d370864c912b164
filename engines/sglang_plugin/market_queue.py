"""The market's view of one SGLang scheduler's waiting queue.

``MarketQueue`` keeps a ``market.mechanism.RequestTree`` in step with the scheduler's
``waiting_queue`` (a list of SGLang ``Req`` that SGLang appends to and admits from):

- ``order(waiting_queue)`` (one call per prefill attempt, from ``calc_priority``) diffs the queue
  against the tree by request id: new requests are inserted (their bid read and checked), gone
  ones removed, and every waiting request is matched against SGLang's KV cache with SGLang's own
  ``match_kv_cache``, updating its ``cached_len`` where the cache changed. Then one round of
  ``clear_tree`` orders the queue in place;
- ``finish_round(batch_reqs)`` (after the scheduler admitted) prices the requests of the round's
  order that made it into the prefill batch, from that round's Clearing, and removes them.

The tree changes only in these two calls, so the Clearing of ``order`` is still valid when the
admitted requests are priced. Requests being aborted (a bad bid, or aborted by SGLang) are kept
at the front of the queue and out of the market: SGLang runs them as a one-token prefill and
returns their error to the client.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.common import match_kv_cache

from market.mechanism import (
    DFS_AUCTIONS,
    Clearing,
    RequestTree,
    WaitingRequest,
    clear_tree,
)
from scheduler_bridge.contract.control import ControlFollower, ControlState
from scheduler_bridge.contract.records import RoundRecord, auction_fields
from scheduler_bridge.contract.wire import CUSTOM_PARAMS, bid_read, rid_owner, rid_request_id
from scheduler_bridge.contract.writer import AdmittedInfo, RoundRecorder

from . import metrics
from .config import MARKET_POLICIES, PluginConfig

log = logging.getLogger(__name__)


def bid_of(req: Req) -> float:
    """The request's bid in $/s, read as the engine contract says (``wire.bid_read``: from its
    rid, or ``sampling_params.custom_params["bid"]``; neither: 0).

    ValueError (saying what is wrong) when the rid's bid is mangled, the two disagree, or the bid
    is not a finite number in 0..MAX_BID.
    """
    return bid_read(req.rid, getattr(req.sampling_params, CUSTOM_PARAMS, None))[1]


def market_id(req: Req) -> Any:
    """The request's id in the market (its rid without the bid part; a rid that is not a
    string as it is, which the market never holds)."""
    rid = req.rid
    return rid_request_id(rid) if isinstance(rid, str) else rid


def abort_for_bad_bid(req: Req, error: ValueError) -> None:
    """Fail the request with a 400 that says what is wrong with its bid.

    SGLang's own way for a queued request (scheduler.py, "Abort method 2"): the request keeps
    its place, its input becomes one token, and after that one-token prefill the scheduler
    finishes it with ``FINISH_ABORT`` and streams the error to the client.
    """
    req.set_finish_with_abort(f"Invalid bid for the inference market (rid {req.rid!r}): {error}")


class MarketQueue:
    """A RequestTree that mirrors one scheduler's waiting queue, and the rounds run on it."""

    def __init__(
        self,
        config: PluginConfig,
        tree_cache: Any,
        *,
        recorder: RoundRecorder | None = None,
        emit: Callable[[RoundRecord], None] | None = None,
        control: ControlFollower | None = None,
    ) -> None:
        if not config.market_policy:
            raise ValueError(f"policy {config.policy!r} is not one of the market's")
        self.config = config
        self.tree_cache = tree_cache
        self.tree = RequestTree()
        self.recorder = recorder
        self.emit = emit
        # rid -> (the Req, its queue entry time, its token count): a Req that left the queue
        # and came back (retracted) has a new entry time and more tokens, and is re-inserted.
        self._known: dict[str, tuple[Req, float, int]] = {}
        self.clearing: Clearing | None = None
        self._cleared_version = -1
        self.bad_bids = 0  # requests failed for their bid
        self.rounds = 0  # rounds that admitted someone
        self.record_errors = 0
        self.order_errors = 0
        self.unreadable = 0  # requests the market could not read, served in queue order
        self._unreadable_seen: weakref.WeakSet[Req] = weakref.WeakSet()
        self.control = control
        self.control_applied = 0
        self.adder_classes: dict[type, type] = {}  # admission class -> its deferring subclass

    def reset(self) -> None:
        """Forget every request; the next ``order`` rebuilds the tree from the queue."""
        self.tree = RequestTree()
        self._known.clear()
        self.clearing = None
        self._cleared_version = -1
        self.order_errors += 1

    @property
    def policy(self) -> str:
        """The market's policy in effect (one of ``MARKET_POLICIES``)."""
        return self.config.policy  # type: ignore[return-value]

    @property
    def defers_in_batch(self) -> bool:
        """Whether admission keeps shared uncached prefixes out of one batch (DFS auctions)."""
        return self.policy in DFS_AUCTIONS and self.config.knobs.in_batch_defer_tokens > 0

    # --- one round -------------------------------------------------------------------------

    @staticmethod
    def refusal(state: ControlState) -> str | None:
        """Why the queue cannot switch to ``state`` while running (None: it can): only the
        market's own policies run here; SGLang's need a restart with ``MARKET_POLICY``."""
        if state.policy in MARKET_POLICIES:
            return None
        return (
            f"policy {state.policy!r} is SGLang's own; the plugin switches only between the "
            f"market's ({', '.join(MARKET_POLICIES)}) while running; restart with MARKET_POLICY"
        )

    def apply_control(self, state: ControlState) -> None:
        """Run the market's policy and reserve of ``state`` from this round on (a state the
        follower let through: ``refusal`` found nothing against it)."""
        self.config = replace(
            self.config, policy=state.policy, knobs=self.config.knobs.with_reserve(state.reserve)
        )
        self.control_applied += 1
        metrics.count("control_changes")
        log.info(
            "market plugin: control from the market: policy %s, reserve %g $/s",
            state.policy, state.reserve,
        )  # fmt: skip

    def order(self, waiting_queue: list[Req]) -> Clearing:
        """Bring the tree up to date with the queue, clear one round, order the queue in place."""
        if self.control is not None and (state := self.control.take()) is not None:
            self.apply_control(state)
        front = self._sync(waiting_queue)
        clearing = self.clear()
        known = self._known
        ordered = [known[rid][0] for rid in clearing.order]
        waiting_queue[:] = front + ordered if front else ordered
        self.clearing = clearing
        self._cleared_version = self.tree.version
        return clearing

    def clear(self) -> Clearing:
        """One round on the tree as it is, with the policy and knobs in effect."""
        cfg = self.config
        return clear_tree(
            self.tree,
            self.policy,
            reserve=cfg.knobs.reserve,
            tokens_per_second=cfg.tokens_per_second,
            overhead_tokens=cfg.knobs.overhead_tokens,
            charge_scope=cfg.knobs.charge_scope,
        )

    def _sync(self, waiting_queue: Sequence[Req]) -> list[Req]:
        """Diff the queue against the tree; returns the requests being aborted, in queue order."""
        tree = self.tree
        entries = tree.entries
        known = self._known
        cache = self.tree_cache
        front: list[Req] = []
        present = 0
        for req in waiting_queue:
            if not isinstance(req.rid, str):
                self._unreadable(req, TypeError("its rid is not a string"))
                front.append(req)
                continue
            rid = rid_request_id(req.rid)
            if req.to_finish is not None or req.finished_reason is not None:
                front.append(req)
                if rid in known and known[rid][0] is req:  # aborted while it waited
                    tree.remove(rid)
                    del known[rid]
                continue
            output = req.output_ids
            tokens = req.origin_input_ids + output if output else req.origin_input_ids
            arrival = req.time_stats.wait_queue_entry_time
            seen = known.get(rid)
            if seen is None or seen[0] is not req or seen[1] != arrival or seen[2] != len(tokens):
                if seen is not None:
                    tree.remove(rid)
                    del known[rid]
                try:
                    bid = bid_of(req)
                except ValueError as exc:
                    self.bad_bids += 1
                    abort_for_bad_bid(req, exc)
                    front.append(req)
                    continue
                match_kv_cache(req, cache, tokens)
                try:
                    tree.insert(
                        WaitingRequest(
                            rid,
                            tokens,
                            bid,
                            arrival,
                            req.num_matched_prefix_tokens,
                            owner=rid_owner(req.rid),
                        )
                    )
                except (TypeError, ValueError) as exc:  # e.g. an empty rid, no tokens
                    self._unreadable(req, exc)
                    front.append(req)
                    continue
                known[rid] = (req, arrival, len(tokens))
            else:
                match_kv_cache(req, cache, tokens)
                cached = req.num_matched_prefix_tokens
                if entries[rid].req.cached_len != cached:
                    tree.update(rid, cached_len=cached)
            present += 1
        if present != len(known):
            waiting = {market_id(req) for req in waiting_queue}
            for rid in [rid for rid in known if rid not in waiting]:
                tree.remove(rid)
                del known[rid]
        return front

    def _unreadable(self, req: Req, exc: Exception) -> None:
        """A request the market cannot place in its tree: SGLang serves it in queue order,
        ahead of the market's order; said once, then counted once per request."""
        if req in self._unreadable_seen:
            return
        self._unreadable_seen.add(req)
        self.unreadable += 1
        metrics.count("unreadable_requests")
        if self.unreadable == 1:
            log.error(
                "market plugin: cannot read request %r (%s); such requests are served in queue "
                "order, outside the auction (counted in market_plugin_unreadable_requests)",
                req.rid, exc,
            )  # fmt: skip

    def finish_round(self, batch_reqs: Sequence[Req], *, now: float | None = None) -> None:
        """Price the requests of the last ``order`` that the scheduler admitted, and emit.

        ``batch_reqs`` is the new prefill batch; requests in it that were not waiting in that
        round (a continuing chunked request, decoding requests mixed in, aborted ones) are
        not part of the round. Requests re-admitted after a retraction already paid in the
        round that first admitted them and are not charged again.
        """
        clearing, self.clearing = self.clearing, None
        if clearing is None or self._cleared_version != self.tree.version:
            return
        known = self._known
        admitted: list[tuple[str, Req]] = []  # (the market's id, the request)
        for req in batch_reqs:
            rid = market_id(req)
            seen = known.get(rid)
            if seen is not None and seen[0] is req:
                admitted.append((rid, req))
        if not admitted:
            return
        self.rounds += 1
        try:
            self._record(clearing, [a for a in admitted if not a[1].retracted_stain], now)
        except Exception:  # a bug here must not take the scheduler down
            self.record_errors += 1
            log.exception("market round record failed")
        tree = self.tree
        for rid, _ in admitted:
            tree.remove(rid)
            del known[rid]

    def _record(
        self, clearing: Clearing, admitted: list[tuple[str, Req]], now: float | None
    ) -> None:
        """The round's record: emitted, and each admitted request's auction fields put in its
        ``customized_info``, which SGLang carries to the answer's ``meta_info``."""
        if self.recorder is None or not admitted:
            return
        infos = []
        for rid, req in admitted:
            prompt_tokens = self._known[rid][2]
            # SGLang's match at admission (init_next_round_input), at most all but one token.
            cached = min(req.prefix_len, prompt_tokens)
            infos.append(AdmittedInfo(rid, prompt_tokens, cached))
        record = self.recorder.record(
            self.tree, clearing, infos, now=time.time() if now is None else now
        )
        for (_, req), entry in zip(admitted, record["admitted"], strict=True):
            fields = auction_fields(record, entry)
            # One value per output token, as SGLang's customized_info is: ours at the first.
            info = req.customized_info if req.customized_info is not None else {}
            info.update((name, [value]) for name, value in fields.items())
            req.customized_info = info
        if self.emit is not None:
            self.emit(record)

    # --- in-batch sharing, for the admission loop --------------------------------------------

    def begin_batch(self) -> int:
        """Start a prefill batch (see ``RequestTree.begin_batch``)."""
        return self.tree.begin_batch()

    def defer(self, req: Req, batch: int) -> bool:
        """Whether the request would recompute enough uncached tokens shared with the batch."""
        rid = market_id(req)
        if self._cleared_version != self.tree.version or rid not in self.tree:
            return False
        return self.tree.batch_recomputed(rid, batch) >= self.config.knobs.in_batch_defer_tokens

    def admitted_to_batch(self, req: Req, batch: int) -> None:
        """Mark the request's prefix as being computed in the batch."""
        rid = market_id(req)
        if self._cleared_version == self.tree.version and rid in self.tree:
            self.tree.batch_add(rid, batch)
