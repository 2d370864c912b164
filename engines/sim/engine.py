"""The simulated engine: continuous batching over a radix KV cache, with the market's auction.

One code path for both clocks: ``Engine.step(now)`` forms the next batch at time ``now``, works
out how long that forward pass takes (config.EngineConfig's cost model) and returns what happens
at its end. A virtual-time driver jumps the clock by that duration; the real-time server sleeps
it before delivering the results to clients.

Each step is a prefill step or a decode step, as in SGLang without mixed chunks:
- a request in the middle of a chunked prefill continues first;
- otherwise, if there is room, one auction round: the waiting queue is ordered by the policy on
  the maintained request tree, and requests are admitted from the front under the prefill token
  budget, the chunk size, the running-request limit and the KV capacity, stopping at the first
  that does not fit (head of line). Each admitted request's priority charge comes from this
  round's plan;
- if nothing was admitted, the running requests decode one token each.
The KV reservation of a request is its uncached prompt plus its whole output, so the engine never
has to retract a running request (SGLang reserves less and retracts when it guessed wrong).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engines.contract.control import ControlFollower
from engines.contract.eviction import waiting_ranks
from engines.contract.knobs import MarketKnobs
from engines.contract.records import RoundRecord, auction_fields
from engines.contract.tokenizer import VOCAB
from engines.contract.writer import AdmittedInfo, RoundRecorder, token_label
from mechanism import (
    DEFAULT_POLICY,
    DFS_AUCTIONS,
    Clearing,
    RequestTree,
    WaitingRequest,
    clear_tree,
)
from mechanism.aging import WaitBound
from mechanism.policies import policy_checked

from .config import EngineConfig
from .kvcache import ComputedPrefixes, KVCache, KVNode


def synthetic_output(request_id: str, n: int) -> tuple[int, ...]:
    """Deterministic output token ids for a request (the engine's "generation")."""
    h = zlib.crc32(request_id.encode())
    return tuple((h * 2_654_435_761 + i * 40_503) % VOCAB for i in range(1, n + 1))


@dataclass(eq=False)
class SimRequest:
    """A request in the simulated engine. Times are seconds on the engine's clock."""

    id: str
    tokens: tuple[int, ...]
    max_new_tokens: int
    bid: float = 0.0
    arrival: float = 0.0
    owner: str = ""  # its tenant, for tenant-level charges ("": a tenant of its own)
    # What happened to it:
    cached_tokens: int = 0  # prompt tokens found in the KV cache at admission
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    generated: int = 0
    output: tuple[int, ...] = ()
    # The auction's fields from its admitting round's record (records.auction_fields): the bid
    # read, charge (dollars), round_id, position, planned seconds, its place in line when it
    # joined the queue (rank, ahead, queue_len). Empty until admitted.
    auction: dict[str, Any] = field(default_factory=dict, repr=False)
    # Engine state:
    computed: int = field(default=0, repr=False)  # prompt tokens in the KV cache so far
    node: KVNode | None = field(default=None, repr=False)  # locked KV node
    memo: KVNode | None = field(default=None, repr=False)  # where its cache match ended

    @property
    def charge(self) -> float:
        """The priority charge it paid, dollars (0 until admitted)."""
        return self.auction.get("charge", 0.0)

    @property
    def position(self) -> int | None:
        """Its place in the admitting round's order, 0 first."""
        return self.auction.get("position")

    @property
    def rank(self) -> int | None:
        """Its place in line when a round first ordered it, 1 first (records.AdmittedRequest)."""
        return self.auction.get("rank")

    @property
    def planned_completion_s(self) -> float | None:
        return self.auction.get("planned_completion_s")

    @property
    def time_saved_s(self) -> float:
        return self.auction.get("time_saved_s", 0.0)

    @property
    def ttft(self) -> float | None:
        """Time to first token, seconds."""
        return None if self.first_token_at is None else self.first_token_at - self.arrival

    @property
    def e2e(self) -> float | None:
        """End-to-end latency, seconds."""
        return None if self.finished_at is None else self.finished_at - self.arrival


@dataclass
class StepResult:
    """What one forward pass did; its effects are dated ``end``."""

    start: float
    end: float
    kind: str  # "prefill" or "decode"
    prefill_tokens: int = 0
    first_tokens: list[SimRequest] = field(default_factory=list)
    decoded: list[SimRequest] = field(default_factory=list)  # got one more token
    finished: list[SimRequest] = field(default_factory=list)
    record: RoundRecord | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start


class Engine:
    """A continuous-batching engine whose waiting queue is ordered by the market's policy."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        policy: str = DEFAULT_POLICY,
        *,
        knobs: MarketKnobs | None = None,
        engine_id: str = "sim",
        label: Callable[[tuple[int, ...]], str] | None = None,
        control: ControlFollower | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.set_policy(policy)
        self.knobs = knobs or MarketKnobs()
        self.control = control  # the market's control store, if followed: read at each round
        self.recorder = RoundRecorder(
            engine_id=engine_id,
            market=self.knobs.market,
            book_interval_s=self.knobs.book_interval_s,
            label=label or token_label,
        )
        self.tree = RequestTree()
        self.wait_bound = WaitBound()  # the age credits of the bound (knobs.wait_bound_s)
        self.kv = KVCache(self.config.kv_capacity_tokens)
        self.computed = ComputedPrefixes()  # every prefix ever cached, for the count below
        self.waiting: dict[str, SimRequest] = {}
        self.running: list[SimRequest] = []  # admitted, not finished (prefilling or decoding)
        self.chunked: SimRequest | None = None
        self.outside = 0  # KV tokens running requests hold outside the tree (reservations)
        self._by_memo: dict[KVNode, set[str]] = {}  # waiting request ids by match end
        self._arrived: dict[str, None] = {}  # waiting, no round has ordered them yet (in order)
        # The round whose order the cache evicts by (DFS auctions, knobs.evict_by_order), and
        # its ranks once an eviction needed them.
        self._evict_order: Clearing | None = None
        self._ranks: dict[KVNode, int] | None = None
        # Counters for /metrics and the benchmark.
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.prefilled_tokens = 0
        # Prompt tokens admitted uncached that had been computed before: evicted, then computed
        # again (the loss to KV pressure; the benchmark reports it per policy).
        self.recomputed_prompt_tokens = 0
        self.prefill_busy_s = 0.0  # engine seconds spent in prefill steps
        self.generated_tokens = 0
        self.finished_requests = 0
        self.steps = 0
        self.rounds = 0

    def set_policy(self, policy: str) -> None:
        """Switch the ordering policy; it applies from the next round."""
        self.policy = policy_checked(policy)

    def set_reserve(self, reserve: float) -> None:
        """Set the reserve price ($/s of waiting); it applies from the next round."""
        self.knobs = self.knobs.with_reserve(reserve)

    def set_wait_bound(self, wait_bound_s: float) -> None:
        """Set the wait bound (seconds, 0: off); it applies from the next round."""
        self.knobs = self.knobs.with_wait_bound(wait_bound_s)

    @property
    def reserve(self) -> float:
        """The reserve price in effect, $/s of waiting."""
        return self.knobs.reserve

    @property
    def tokens_per_second(self) -> float:
        """The plan's prefill rate: the knob, or the cost model's long-prefill rate."""
        return self.knobs.plan_rate(self.config.prefill_tokens_per_second)

    # --- requests in --------------------------------------------------------------------------

    def submit(self, req: SimRequest) -> None:
        """Queue a request; ValueError (naming it) if it is malformed or can never fit."""
        if req.id in self.waiting or any(r.id == req.id for r in self.running):
            raise ValueError(f"duplicate request id {req.id!r}")
        if isinstance(req.max_new_tokens, bool) or not isinstance(req.max_new_tokens, int):
            raise ValueError(f"request {req.id!r}: max_new_tokens must be an int")
        if req.max_new_tokens < 1:
            raise ValueError(f"request {req.id!r}: max_new_tokens must be >= 1")
        need = len(req.tokens) + req.max_new_tokens + 1
        if need >= self.config.kv_capacity_tokens:
            raise ValueError(
                f"request {req.id!r} needs {need} KV tokens, more than the cache's "
                f"{self.config.kv_capacity_tokens}"
            )
        req.tokens = tuple(req.tokens)
        cached = self._cached(req)
        self.tree.insert(
            WaitingRequest(req.id, req.tokens, req.bid, req.arrival, cached, owner=req.owner)
        )
        self.waiting[req.id] = req
        self._arrived[req.id] = None
        self.wait_bound.admit(req.id, req.arrival)

    def cancel(self, request_id: str) -> bool:
        """Drop a waiting request (its client went away); False if it is not waiting."""
        if request_id not in self.waiting:
            return False
        self._unfile(self.waiting.pop(request_id))
        self.tree.remove(request_id)
        self._arrived.pop(request_id, None)
        self.recorder.forget(request_id)
        return True

    def _cached(self, req: SimRequest) -> int:
        """Match the prompt in the KV cache (all but the last token, which must be computed) and
        file the request under the node where the match ended."""
        length, node = self.kv.match(req.tokens, len(req.tokens) - 1)
        req.memo = node
        self._by_memo.setdefault(node, set()).add(req.id)
        return length

    def _unfile(self, req: SimRequest) -> None:
        ids = self._by_memo.get(req.memo)
        if ids is not None:
            ids.discard(req.id)
            if not ids:
                del self._by_memo[req.memo]
        req.memo = None

    def _refresh_cached(self) -> None:
        """Bring the waiting requests' cached lengths up to date with the KV cache.

        Only the requests whose match ended at a node that changed since the last round are
        matched again: elsewhere nothing could have moved.
        """
        changed = self.kv.changed
        if not changed:
            return
        tree = self.tree
        for node in changed:
            ids = self._by_memo.pop(node, None)
            if not ids:
                continue
            for rid in ids:
                req = self.waiting[rid]
                now = self._cached(req)
                if now != tree.get(rid).cached_len:
                    tree.update(rid, cached_len=now)
        changed.clear()

    # --- the step ---------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def step(self, now: float) -> StepResult | None:
        """Run one forward pass starting at ``now``; None when there is nothing to do."""
        if self.idle:
            return None
        cfg = self.config
        chunks: list[tuple[SimRequest, int]] = []
        budget = min(cfg.max_prefill_tokens, cfg.chunked_prefill_size)
        if self.chunked is not None:
            req = self.chunked
            n = min(len(req.tokens) - req.computed, budget)
            chunks.append((req, n))
            budget -= n
            if req.computed + n >= len(req.tokens):
                self.chunked = None
        record = None
        if self.chunked is None and self.waiting and budget > 0:
            record = self._round(now, chunks, budget)
        self.steps += 1
        if chunks:
            return self._prefill(now, chunks, record)
        return self._decode(now)

    def _round(
        self, now: float, chunks: list[tuple[SimRequest, int]], budget: int
    ) -> RoundRecord | None:
        """One auction round: order the queue, admit from the front, price the admitted."""
        if self.control is not None and (state := self.control.take()) is not None:
            self.set_policy(state.policy)
            self.set_reserve(state.reserve)
            self.set_wait_bound(state.wait_bound_s)
        self.wait_bound.advance(self.tree, now, self.knobs.age_credit(self.policy))
        cfg = self.config
        room = cfg.max_running_requests - len(self.running)
        if room <= 0:
            return None
        self._refresh_cached()
        fallback = cfg.lpm_fcfs_fallback and len(self.waiting) > cfg.lpm_fallback_threshold
        policy = "fcfs" if self.policy == "lpm" and fallback else self.policy  # as SGLang's lpm
        knobs = self.knobs
        clearing = clear_tree(
            self.tree,
            policy,
            reserve=knobs.reserve,
            tokens_per_second=self.tokens_per_second,
            overhead_tokens=knobs.overhead_tokens,
            charge_scope=knobs.charge_scope,
        )
        self.recorder.placed(clearing, self._arrived)  # the place in line of those new to it
        self._arrived.clear()
        defer = policy in DFS_AUCTIONS and knobs.in_batch_defer_tokens > 0
        self._evict_order = clearing if policy in DFS_AUCTIONS and knobs.evict_by_order else None
        self._ranks = None
        batch = self.tree.begin_batch() if defer else None
        self.rounds += 1
        admitted: list[SimRequest] = []
        for rid in clearing.iter_order():
            if len(admitted) >= room or budget <= 0:
                break
            req = self.waiting[rid]
            if (
                batch is not None
                and self.tree.batch_recomputed(rid, batch) >= knobs.in_batch_defer_tokens
            ):
                continue  # the shared prefix is being computed now: next step
            match = self._reserve(req)
            if match is None:
                break  # no room in the KV cache: head-of-line blocking
            if batch is not None:
                self.tree.batch_add(rid, batch)
            req.computed = req.cached_tokens = match
            before = self.computed.match(req.tokens, len(req.tokens) - 1)
            if before > match:
                self.recomputed_prompt_tokens += before - match
            req.admitted_at = now
            extend = len(req.tokens) - match
            n = min(extend, budget)
            chunks.append((req, n))
            budget -= n
            admitted.append(req)
            if n < extend:
                self.chunked = req
                break
        if not admitted:
            return None
        record = self.recorder.record(
            self.tree,
            clearing,
            [AdmittedInfo(r.id, len(r.tokens), r.cached_tokens) for r in admitted],
            now=now,
            seq=self.rounds,
        )
        for req, entry in zip(admitted, record["admitted"], strict=True):
            req.auction = auction_fields(record, entry)
            self._unfile(self.waiting.pop(req.id))
            self.tree.remove(req.id)
            self.running.append(req)
            self.prompt_tokens += len(req.tokens)
            self.cached_prompt_tokens += req.cached_tokens
        return record

    def _reserve(self, req: SimRequest) -> int | None:
        """Lock the request's cached prefix and make room in the KV cache for the rest of its
        prompt and its whole output; its cached length, or None when it cannot fit now."""
        kv = self.kv
        match, node = kv.match(req.tokens, len(req.tokens) - 1)
        kv.lock(node)
        need = len(req.tokens) - match + req.max_new_tokens
        if need + 1 >= kv.capacity - (kv.size - kv.evictable) - self.outside:
            kv.unlock(node)
            return None
        if (over := kv.size + self.outside + need - kv.capacity) > 0:
            kv.evict(over, self._eviction_ranks())
        self.outside += need
        req.node = node
        return match

    def _eviction_ranks(self) -> dict[KVNode, int] | None:
        """Under a DFS auction (``evict_by_order``), the round's ranks of the cached prefixes
        of the waiting requests (eviction.waiting_ranks), worked out at the round's first
        eviction; None: the cache's own LRU."""
        if self._evict_order is None:
            return None
        if self._ranks is None:
            waiting = self.waiting
            self._ranks = waiting_ranks(waiting[rid].memo for rid in self._evict_order.iter_order())
        return self._ranks

    @property
    def engine_id(self) -> str:
        """Which engine instance the round records name (the server sets it once bound)."""
        return self.recorder.engine_id

    @engine_id.setter
    def engine_id(self, value: str) -> None:
        self.recorder.engine_id = value

    def _prefill(self, now: float, chunks, record) -> StepResult:
        duration = self.config.prefill_step_s([(n, req.computed) for req, n in chunks])
        self.prefill_busy_s += duration
        end = now + duration
        result = StepResult(now, end, "prefill", record=record)
        kv = self.kv
        for req, n in chunks:
            req.computed += n
            self.outside -= n
            self.prefilled_tokens += n
            result.prefill_tokens += n
            _, node = kv.insert(req.tokens, req.computed)
            self.computed.insert(req.tokens, req.computed)
            kv.lock(node)
            kv.unlock(req.node)
            req.node = node
            if req.computed >= len(req.tokens):
                req.output = synthetic_output(req.id, req.max_new_tokens)
                req.generated = 1
                req.first_token_at = end
                self.generated_tokens += 1
                result.first_tokens.append(req)
                if req.generated >= req.max_new_tokens:
                    self._finish(req, end, result)
        return result

    def _decode(self, now: float) -> StepResult | None:
        decoding = [r for r in self.running if r.first_token_at is not None]
        if not decoding:
            return None
        context = sum(len(r.tokens) + r.generated for r in decoding)
        end = now + self.config.decode_step_s(len(decoding), context)
        result = StepResult(now, end, "decode")
        for req in decoding:
            req.generated += 1
            self.generated_tokens += 1
            result.decoded.append(req)
            if req.generated >= req.max_new_tokens:
                self._finish(req, end, result)
        return result

    def _finish(self, req: SimRequest, end: float, result: StepResult) -> None:
        req.finished_at = end
        self.running.remove(req)
        self.outside -= req.max_new_tokens
        kv = self.kv
        full = req.tokens + req.output
        kv.insert(full, len(full))
        self.computed.insert(full, len(full))
        kv.unlock(req.node)
        req.node = None
        self.finished_requests += 1
        result.finished.append(req)

    # --- reading ----------------------------------------------------------------------------

    def queue_drain_s(self) -> float:
        """Planned seconds to prefill everything waiting now (its uncached tokens, shared
        prefixes counted once, plus the overheads): a bound on a new request's planned wait
        at bid 0 if nothing else arrives. Time proportional to the waiting tree's size."""
        tree = self.tree
        work = sum(x.ew for x in tree.nodes()) + len(tree) * self.knobs.overhead_tokens
        return work / self.tokens_per_second

    @property
    def cache_hit_rate(self) -> float:
        """Share of admitted prompt tokens found in the KV cache."""
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
