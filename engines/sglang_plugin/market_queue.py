"""The market's view of one SGLang scheduler's waiting queue.

``MarketQueue`` keeps a ``mechanism.RequestTree`` in step with the scheduler's
``waiting_queue`` (a list of SGLang ``Req`` that SGLang appends to and admits from):

- ``order(waiting_queue)`` (one call per prefill attempt, from ``calc_priority``) diffs the queue
  against the tree, looking only at its tail where SGLang appends (a full diff, by identity,
  only when a request left without a round): new requests are inserted (their bid read and
  checked, their prefix matched once with SGLang's own ``match_kv_cache``), gone ones removed.
  The cached lengths of the requests already waiting follow the radix cache's own changes since
  the last round (``cache_tracking``), so they are not matched again; with a cache the plugin
  cannot follow, every waiting request is matched again, as SGLang's cache-aware policies do.
  With the wait bound on, the requests that crossed a credit step get their new age credits
  (``mechanism.aging.WaitBound``, on SGLang's clock of queue entry, ``time.perf_counter``).
  Then one round of ``clear_tree`` (which works out again only the subtrees that changed)
  orders the queue in place;
- ``finish_round(batch_reqs)`` (after the scheduler admitted) prices the requests of the round's
  order that made it into the prefill batch, from that round's Clearing, and removes them.

The tree changes only in these two calls, so the Clearing of ``order`` is still valid when the
admitted requests are priced. Requests being aborted when first seen (a bad bid, or aborted by
SGLang on arrival) are kept at the front of the queue and out of the market: SGLang runs them as
a one-token prefill and returns their error to the client.
"""

from __future__ import annotations

import logging
import time
import weakref
from array import array
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import (
    WAITING_PREFIX_REFRESH_INTERVAL,
    WAITING_QUEUE_PREFIX_MATCH_MAX,
)
from sglang.srt.mem_cache.common import match_kv_cache, touch_waiting_prefix

from engines.contract.control import ControlFollower, ControlState
from engines.contract.records import RoundRecord, auction_fields
from engines.contract.wire import CUSTOM_PARAMS, AuctionParams, auction_read
from engines.contract.writer import AdmittedInfo, RoundRecorder
from mechanism import (
    DFS_AUCTIONS,
    Clearing,
    RequestTree,
    WaitingRequest,
    clear_tree,
)
from mechanism.aging import WaitBound

from . import cache_tracking, eviction, metrics
from .config import MARKET_POLICIES, PluginConfig

log = logging.getLogger(__name__)


def _waiting_prefix_refresh() -> bool:
    """SGLang's switch for refreshing the waiting requests' prefixes (on unless turned off)."""
    try:
        from sglang.srt.environ import envs

        return bool(envs.SGLANG_ENABLE_WAITING_PREFIX_REFRESH.get())
    except (ImportError, AttributeError):
        return True


def auction_of(req: Req) -> AuctionParams:
    """The request's bid in $/s and its tenant's tag, read as the engine contract says
    (``wire.auction_read``: from ``sampling_params.custom_params``; no bid: 0).

    ValueError (saying what is wrong) when the bid is not a finite number in 0..MAX_BID, or the
    tag is not one.
    """
    return auction_read(getattr(req.sampling_params, CUSTOM_PARAMS, None), request_id=req.rid)


def abort_for_bad_bid(req: Req, error: ValueError) -> None:
    """Fail the request with a 400 that says what is wrong with its bid (or its tenant's tag).

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
        self.wait_bound = WaitBound()  # the age credits of the bound (knobs.wait_bound_s)
        self.recorder = recorder
        self.emit = emit
        # id() -> market id of the requests in the tree (each Entry's handle is its Req): the
        # queue's diff.
        self._members: dict[int, str] = {}
        self._outside: dict[int, Req] = {}  # waiting requests kept out of the tree (the front)
        # The radix cache's changes, followed (None: a cache the plugin cannot follow, whose
        # waiting requests are all matched every round); each followed request's cap on its
        # match; the requests matched every round anyway (another cache namespace).
        why = cache_tracking.supported(tree_cache)
        self.tracker = cache_tracking.CacheTracker(tree_cache) if why is None else None
        if why is not None:
            log.info("market plugin: matching every waiting request every round (%s)", why)
        self._caps: dict[str, int] = {}
        self._rematch: set[str] = set()
        # The cache evicts by the last round's order (eviction.py): that order's positions by
        # request id, and the ranks of the leaves asked about since, both worked out on demand.
        self._ordered: list[Req] = []
        self._positions: dict[str, int] | None = None
        self._leaf_ranks: dict[Any, int | None] = {}
        if self.tracker is not None:
            eviction.install(tree_cache, self)
        self._arrived: list[str] = []  # in the tree, no round has ordered them yet
        self._orders = 0  # rounds ordered, for the waiting-prefix refresh
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
        if self.recorder is not None:
            for rid in self._members.values():
                self.recorder.forget(rid)  # placed again on their way back in
        self.tree = RequestTree()
        self.wait_bound = WaitBound()
        for kept in (self._members, self._outside, self._caps, self._rematch, self._arrived):
            kept.clear()
        if self.tracker is not None:
            self.tracker.changes.clear()  # every request is matched afresh on its way back in
        self.clearing = None
        self._cleared_version = -1
        self._ordered = []
        self._positions = None
        self._leaf_ranks = {}
        self.order_errors += 1

    @property
    def policy(self) -> str:
        """The market's policy in effect (one of ``MARKET_POLICIES``)."""
        return self.config.policy  # type: ignore[return-value]

    @property
    def defers_in_batch(self) -> bool:
        """Whether admission keeps shared uncached prefixes out of one batch (DFS auctions)."""
        return self.policy in DFS_AUCTIONS and self.config.knobs.in_batch_defer_tokens > 0

    @property
    def evicts_by_order(self) -> bool:
        """Whether the followed cache evicts by the round's order (a DFS auction, the knob on)."""
        return self.policy in DFS_AUCTIONS and self.config.knobs.evict_by_order

    def leaf_rank(self, node: Any) -> int | None:
        """A leaf's rank for eviction (engines.contract.eviction): the position in the last
        round's order of the first waiting request whose cached prefix evicting the leaf would
        shorten (one that arrived since counts as last); None: no waiting request's. Worked
        out once per leaf and round, from the request tree (``RequestTree.sharing``)."""
        ranks = self._leaf_ranks
        if node in ranks:
            return ranks[node]
        rank: int | None = None
        key = node.key
        if self.tree.entries and key.extra_key is None and key.cache_salt is None:
            parts, depth = cache_tracking.leaf_path(self.tree_cache, node)
            need = depth + self.tree_cache.page_size  # the leaf's first page, at least
            positions = self._positions
            if positions is None:
                positions = self._positions = {r.rid: i for i, r in enumerate(self._ordered)}
            last = len(positions)
            caps = self._caps
            for entry, _ in self.tree.sharing(cache_tracking.path_tokens(parts), need):
                rid = entry.req.id
                if caps.get(rid, need) < need:
                    continue  # SGLang would not use that much of its match
                pos = positions.get(rid, last)
                if rank is None or pos < rank:
                    rank = pos
        ranks[node] = rank
        return rank

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
        """Run the market's policy, reserve and wait bound of ``state`` from this round on (a
        state the follower let through: ``refusal`` found nothing against it)."""
        knobs = self.config.knobs.with_reserve(state.reserve).with_wait_bound(state.wait_bound_s)
        self.config = replace(self.config, policy=state.policy, knobs=knobs)
        self.control_applied += 1
        metrics.count("control_changes")
        log.info(
            "market plugin: control from the market: policy %s, reserve %g $/s, wait bound %g s",
            state.policy, state.reserve, state.wait_bound_s,
        )  # fmt: skip

    def order(self, waiting_queue: list[Req], *, now: float | None = None) -> Clearing:
        """Bring the tree up to date with the queue, clear one round, order the queue in place.

        ``now``: the round's time on SGLang's clock of queue entry (``time.perf_counter``),
        for the wait bound; None: the clock's now."""
        if self.control is not None and (state := self.control.take()) is not None:
            self.apply_control(state)
        front = self._sync(waiting_queue)
        credit = self.config.knobs.age_credit(self.policy)
        self.wait_bound.advance(self.tree, time.perf_counter() if now is None else now, credit)
        clearing = self.clear()
        if self.recorder is not None:  # the place in line of the requests new to the market
            self.recorder.placed(clearing, self._arrived)
        self._arrived.clear()
        ordered = clearing.handles()
        waiting_queue[:] = front + ordered if front else ordered
        self._ordered = ordered
        self._positions = None
        self._leaf_ranks = {}
        self.clearing = clearing
        self._cleared_version = self.tree.version
        self._refresh_head(ordered)
        return clearing

    def _refresh_head(self, ordered: list[Req]) -> None:
        """Keep the cache's LRU order fresh for the head of the order, as SGLang does for its
        cache-blind policies (``SchedulePolicy._touch_waiting_prefixes``, on by default): every
        ``WAITING_PREFIX_REFRESH_INTERVAL`` rounds the first ``WAITING_QUEUE_PREFIX_MATCH_MAX``
        requests' prefixes are touched, head last, so that eviction takes the prefixes served
        last first. (Matching every request every round touched them all.)"""
        if self.tracker is None or not _waiting_prefix_refresh():
            return
        self._orders += 1
        if self._orders % WAITING_PREFIX_REFRESH_INTERVAL != 1:
            return
        cache = self.tree_cache
        for req in reversed(ordered[:WAITING_QUEUE_PREFIX_MATCH_MAX]):
            touch_waiting_prefix(req, cache)

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
        """Diff the queue against the tree; returns the requests kept out of it (being aborted,
        unreadable), in queue order."""
        tree = self.tree
        if self.tracker is not None:
            self.tracker.apply(tree, self._caps, self._cached_changed)
        members = self._members
        outside = self._outside
        # SGLang only ever appends to the waiting queue (arrivals, retracted requests) and
        # takes requests out of it (admitted: ``finish_round`` saw them; aborted: popped). So
        # the requests new since the last round are a tail of the queue, and the rest are all
        # known unless some left without a round. Both are checked without a pass over the
        # queue (a pass costs ~0.2 us a request: the objects are large and scattered); the
        # full diff runs only when the count says a request left unseen.
        new: list[Req] = []
        k = len(waiting_queue)
        while k:
            req = waiting_queue[k - 1]
            key = id(req)
            if key in members or key in outside:
                break
            new.append(req)
            k -= 1
        if k != len(members) + len(outside):
            new = self._full_diff(waiting_queue)
        else:
            new.reverse()
        arrived = self._arrived
        for req in new:
            if self._arrive(req):
                arrived.append(req.rid)
            else:
                outside[id(req)] = req
        if self._rematch:
            self._match_again()
        if not outside:
            return []
        return [req for req in waiting_queue if id(req) in outside]

    def _full_diff(self, waiting_queue: Sequence[Req]) -> list[Req]:
        """Forget the requests gone from the queue; returns the new ones, in queue order."""
        members = self._members
        outside = self._outside
        ids = list(map(id, waiting_queue))  # by id(): no request object is read
        present = set(ids)
        for key in members.keys() - present:  # gone without a round: the client went away
            self._forget(members[key])
        for key in outside.keys() - present:
            del outside[key]
        fresh = present - members.keys() - outside.keys()
        return [req for req, key in zip(waiting_queue, ids, strict=True) if key in fresh]

    def _arrive(self, req: Req) -> bool:
        """A request new to the queue: into the tree (matched once; True), or to be kept out of
        the market (False)."""
        if not isinstance(req.rid, str):
            self._unreadable(req, TypeError("its rid is not a string"))
            return False
        if req.to_finish is not None or req.finished_reason is not None:
            return False  # being aborted: SGLang finishes it
        try:
            auction = auction_of(req)
        except ValueError as exc:
            self.bad_bids += 1
            abort_for_bad_bid(req, exc)
            return False
        rid = req.rid
        output = req.output_ids
        # A copy (SGLang's arrays are the request's own): array("q") as SGLang keeps them.
        tokens = req.origin_input_ids + output if output else array("q", req.origin_input_ids)
        if rid in self.tree:  # the same id twice in the queue: the second waits outside
            self._unreadable(req, ValueError(f"request id {rid!r} is already waiting"))
            return False
        match_kv_cache(req, self.tree_cache, tokens)
        arrival = req.time_stats.wait_queue_entry_time
        try:
            self.tree.insert(
                WaitingRequest(
                    rid,
                    tokens,
                    auction.bid,
                    arrival,
                    req.num_matched_prefix_tokens,
                    owner=auction.owner,
                ),
                handle=req,
            )
        except (TypeError, ValueError) as exc:  # e.g. an empty rid, no tokens
            self._unreadable(req, exc)
            return False
        self._members[id(req)] = rid
        self.wait_bound.admit(rid, arrival)
        if self.tracker is not None and cache_tracking.tracked(req):
            self._caps[rid] = req._compute_max_prefix_len(len(tokens))
        else:
            self._rematch.add(rid)
        return True

    def _forget(self, rid: str) -> None:
        """Take a request out of the tree (admitted, or gone from the queue)."""
        del self._members[id(self.tree.entries[rid].handle)]
        self._caps.pop(rid, None)
        self._rematch.discard(rid)
        self.tree.remove(rid)
        if self.recorder is not None:
            self.recorder.forget(rid)  # a place not taken by a record: it left unpriced

    def _match_again(self) -> None:
        """Match the requests the cache's changes do not tell about, as SGLang would."""
        tree = self.tree
        entries = tree.entries
        cache = self.tree_cache
        for rid in self._rematch:
            req = entries[rid].handle
            match_kv_cache(req, cache)  # its prompt and output, as SGLang matches it
            cached = req.num_matched_prefix_tokens
            if entries[rid].req.cached_len != cached:
                tree.update(rid, cached_len=cached)

    def _cached_changed(self, rid: str, cached: int) -> None:
        """A followed request's cached length changed: SGLang's field for it says so too (its
        load reports read it)."""
        self.tree.entries[rid].handle.num_matched_prefix_tokens = cached

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
        round that first admitted them and are not charged again; requests aborted in place
        while they waited (SGLang pops the requests it aborts from the queue; a request aborted
        otherwise is not looked for every round) are admitted and not charged.
        """
        clearing, self.clearing = self.clearing, None
        members = self._members
        admitted: list[tuple[str, Req]] = []  # (the market's id, the request)
        for req in batch_reqs:
            rid = members.get(id(req))
            if rid is not None:
                admitted.append((rid, req))
        if not admitted:
            return
        if clearing is not None and self._cleared_version == self.tree.version:
            self.rounds += 1
            # Not priced: re-admitted after a retraction (paid when first admitted), or aborted
            # in place while it waited (SGLang finishes it with its error after this prefill).
            priced = [
                a
                for a in admitted
                if not a[1].retracted_stain
                and a[1].to_finish is None
                and a[1].finished_reason is None
            ]
            try:
                self._record(clearing, priced, now)
            except Exception:  # a bug here must not take the scheduler down
                self.record_errors += 1
                log.exception("market round record failed")
        for rid, _ in admitted:  # out of the tree whatever happened to the record
            self._forget(rid)

    def _record(
        self, clearing: Clearing, admitted: list[tuple[str, Req]], now: float | None
    ) -> None:
        """The round's record: emitted, and each admitted request's auction fields put in its
        ``customized_info``, which SGLang carries to the answer's ``meta_info``."""
        if self.recorder is None or not admitted:
            return
        infos = []
        for rid, req in admitted:
            prompt_tokens = len(self.tree.get(rid).tokens)
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
            info.update({name: [value] for name, value in fields.items()})
            req.customized_info = info
        if self.emit is not None:
            self.emit(record)

    # --- in-batch sharing, for the admission loop --------------------------------------------

    def begin_batch(self) -> int:
        """Start a prefill batch (see ``RequestTree.begin_batch``)."""
        return self.tree.begin_batch()

    def defer(self, req: Req, batch: int) -> bool:
        """Whether the request would recompute enough uncached tokens shared with the batch."""
        rid = req.rid
        if self._cleared_version != self.tree.version or rid not in self.tree:
            return False
        return self.tree.batch_recomputed(rid, batch) >= self.config.knobs.in_batch_defer_tokens

    def admitted_to_batch(self, req: Req, batch: int) -> None:
        """Mark the request's prefix as being computed in the batch."""
        rid = req.rid
        if self._cleared_version == self.tree.version and rid in self.tree:
            self.tree.batch_add(rid, batch)
