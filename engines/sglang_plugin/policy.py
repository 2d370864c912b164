"""The auction inside SGLang's scheduler: a ``SchedulePolicy`` subclass and two scheduler hooks.

``AuctionSchedulePolicy`` replaces ``sglang.srt.managers.schedule_policy.SchedulePolicy``
(``register`` in ``__init__``). With one of the market's policies configured
(``config.MARKET_POLICIES``) its ``calc_priority`` orders the waiting queue as
``mechanism.clear_tree`` orders it, on a request tree it keeps in step with the queue
(``market_queue.MarketQueue``). Otherwise every method is SGLang's own.

The hooks on SGLang's ``Scheduler``:

- AFTER ``get_new_batch_prefill``: the prefill batch it returns holds the requests admitted in
  this round; they are priced from the round's Clearing and the round record is emitted;
- AFTER ``get_prefill_adder_class``: for a DFS auction, a subclass of the admission class that
  keeps a request out of the batch when it would recompute a long uncached prefix that a
  request already in the batch computes (as the simulated engine does).
"""

from __future__ import annotations

import logging
from typing import Any

# Imported as a module, not ``from ... import SchedulePolicy``: SGLang's hook registry rebinds
# every module-level name bound to the replaced class, and would rebind ours to our subclass.
import sglang.srt.managers.schedule_policy as sglang_policy
from sglang.srt.managers.schedule_batch import NextBatchPlan, Req, ScheduleBatch

from engines.contract.control import ControlFollower, follower_for
from engines.contract.sinks import sink_for
from engines.contract.writer import RoundRecorder, token_label, tokenizer_label

from . import metrics
from .config import PluginConfig, config_from_env
from .market_queue import MarketQueue
from .rank_control import RankSharedControl

log = logging.getLogger(__name__)


def _engine_id() -> str:
    """The engine id, "sglang@host:port" (SGLang's server args), with the DP rank if several."""
    try:
        from sglang.srt.runtime_context import get_parallel, get_serving

        serving = get_serving()
        name = f"sglang@{serving.host}:{serving.port}"
        parallel = get_parallel()
        if getattr(parallel, "num_dp_ranks", 1) and parallel.num_dp_ranks > 1:
            name += f"/dp{parallel.attn_dp_rank}"
        return name
    except Exception:  # noqa: BLE001 - no published server args (tests, tools)
        return "sglang"


def _reporting_rank() -> bool:
    """Whether this scheduler process reports rounds: one per data-parallel replica."""
    try:
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        return parallel.attn_tp_rank == 0 and parallel.pp_rank == 0
    except Exception:  # noqa: BLE001 - no published server args (tests, tools)
        return True


def _attn_tp_group() -> Any | None:
    """SGLang's attention-TP group coordinator of this scheduler (``world_size``, ``rank``,
    ``first_rank``, ``cpu_group``); None without a published runtime context (tests, tools)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        return get_parallel().attn_tp_group
    except Exception:  # noqa: BLE001 - no published server args (tests, tools)
        return None


# SGLang's own startup rule (arg_groups/validation_hook.py): priority scheduling runs only
# under these policies.
PRIORITY_POLICIES = ("fcfs", "lof")


def startup_checked(config: PluginConfig, *, enable_priority_scheduling: bool) -> None:
    """Refuse at startup what SGLang would refuse for its own ``--schedule-policy``, and what
    cannot work with the market's: ValueError saying which setting to change."""
    if config.policy is None:
        return
    if enable_priority_scheduling and config.policy not in PRIORITY_POLICIES:
        raise ValueError(
            f"market plugin: MARKET_POLICY={config.policy} with --enable-priority-scheduling: "
            f"priority scheduling needs policy {' or '.join(PRIORITY_POLICIES)} (SGLang's "
            "rule); the market's policies order by bid, not by priority. Unset one of them."
        )


def _decode_only() -> bool:
    try:
        from sglang.srt.runtime_context import get_disagg

        return get_disagg().disaggregation_mode == "decode"
    except Exception:  # noqa: BLE001
        return False


class AuctionSchedulePolicy(sglang_policy.SchedulePolicy):
    """SGLang's SchedulePolicy, plus the market's policies when one is configured.

    ``market_config`` (keyword only) overrides the config read from the environment
    (``config.config_from_env``); SGLang builds the policy with its five positional arguments.
    The class attributes are the inert plugin's, so an object made without ``__init__`` (as
    SGLang's own tests make some) runs SGLang's policy.
    """

    market: MarketQueue | None = None
    sink: Any = None
    control: ControlFollower | None = None
    market_config: PluginConfig = PluginConfig()

    def __init__(
        self,
        policy: str,
        tree_cache: Any,
        enable_hierarchical_cache: bool,
        enable_priority_scheduling: bool,
        schedule_low_priority_values_first: bool,
        *,
        market_config: PluginConfig | None = None,
        sink: Any | None = None,
        tokenizer: Any | None = None,
    ) -> None:
        config = config_from_env() if market_config is None else market_config
        startup_checked(config, enable_priority_scheduling=enable_priority_scheduling)
        if config.policy is not None and not config.market_policy:
            if config.policy != policy:
                log.info("market plugin: schedule policy %s instead of %s", config.policy, policy)
            policy = config.policy  # one of SGLang's: SGLang runs it
        super().__init__(
            policy,
            tree_cache,
            enable_hierarchical_cache,
            enable_priority_scheduling,
            schedule_low_priority_values_first,
        )
        self.market_config = config
        self.market: MarketQueue | None = None
        self.sink = None
        if config.market_policy and not _decode_only():
            self.sink = sink
            if self.sink is None and _reporting_rank():
                self.sink = sink_for(
                    config.redis_url,
                    config.knobs.rounds_stream,
                    queue_size=config.record_queue_size,
                    jsonl_path=config.rounds_jsonl,
                )
            recorder = RoundRecorder(
                engine_id=config.engine_id or _engine_id(),
                market=config.knobs.market,
                book_interval_s=config.knobs.book_interval_s,
                label=token_label if tokenizer is None else tokenizer_label(tokenizer),
            )
            self.control = self._control_follower(config)
            self.market = MarketQueue(
                config,
                tree_cache,
                recorder=recorder,
                emit=None if self.sink is None else self.sink.offer,
                control=self.control,
            )
            log.info(
                "market plugin: policy %s, reserve %g $/s, %g tokens/s, rounds to %s",
                config.policy,
                config.knobs.reserve,
                config.tokens_per_second,
                f"Redis stream {config.knobs.rounds_stream}" if config.redis_url else "memory",
            )

    @staticmethod
    def _control_follower(config: PluginConfig) -> ControlFollower | RankSharedControl | None:
        """The follower of the market's control store, started (it reads the store once now).

        With attention TP > 1 the ranks share one follower, on the group's first rank
        (``rank_control``), so that every rank switches in the same round.
        """
        if not config.follow_control:
            return None
        tp = _attn_tp_group()
        if tp is not None and tp.world_size > 1:
            leader = tp.rank == tp.first_rank
            follower = AuctionSchedulePolicy._store_follower(config) if leader else None
            if leader and follower is None:
                return None
            return RankSharedControl(follower, group=tp.cpu_group, src=tp.first_rank, rank=tp.rank)
        return AuctionSchedulePolicy._store_follower(config)

    @staticmethod
    def _store_follower(config: PluginConfig) -> ControlFollower | None:
        follower = follower_for(
            market=config.knobs.market,
            redis_url=config.redis_url,
            poll_s=config.control_poll_s,
            accept=MarketQueue.refusal,
            on_refused=lambda: metrics.count("control_refused"),
        )
        return None if follower is None else follower.start()

    def calc_priority(
        self,
        waiting_queue: list[Req],
        running_batch: ScheduleBatch | None = None,
        processed_tokens: int = 0,
    ) -> None:
        """Order the waiting queue in place: the market's round, or SGLang's policy."""
        if self.market is None:
            return super().calc_priority(waiting_queue, running_batch, processed_tokens)
        try:
            self.market.order(waiting_queue)
        except Exception:  # a bug of ours must not stop the engine: serve in queue order
            market = self.market
            if market.order_errors == 0:
                log.exception(
                    "market plugin: ordering failed; this round runs in queue order and the "
                    "request tree is rebuilt (said once; counted in "
                    "market_plugin_order_failures_total)"
                )
            metrics.count("order_failures")
            market.reset()
        return None

    def waiting_queue_prefix_matched(self, waiting_queue: list[Req]) -> bool:
        """Whether ``calc_priority`` matched every waiting request (the market's always does)."""
        if self.market is None:
            return super().waiting_queue_prefix_matched(waiting_queue)
        return True

    def shortest_prefill_chunk_limit(
        self, chunked_req: Req, waiting_queue: list[Req], budget: int, page_size: int
    ) -> int | None:
        """SGLang's chunk cap of shortest-prefill-first; none under the market's policies."""
        if self.market is None:
            return super().shortest_prefill_chunk_limit(
                chunked_req, waiting_queue, budget, page_size
            )
        return None

    def finish_round(self, plan: NextBatchPlan | None) -> None:
        """Price and report the requests of the last round that the scheduler admitted."""
        if self.market is None:
            return
        batch = None if plan is None else plan.batch_to_run
        self.market.finish_round([] if batch is None else batch.reqs)

    def adopt_tokenizer(self, tokenizer: Any) -> None:
        """Label the order book's subtrees with decoded text (SGLang's tokenizer, if any)."""
        recorder = None if self.market is None else self.market.recorder
        if recorder is not None and tokenizer is not None and recorder.label is token_label:
            recorder.label = tokenizer_label(tokenizer)


# --- the hooks on Scheduler -----------------------------------------------------------------


def after_get_new_batch_prefill(
    result: NextBatchPlan, scheduler: Any, *args: Any, **kwargs: Any
) -> None:
    """AFTER hook on ``Scheduler.get_new_batch_prefill``: finish the market's round."""
    policy = getattr(scheduler, "policy", None)
    if isinstance(policy, AuctionSchedulePolicy) and policy.market is not None:
        try:
            policy.adopt_tokenizer(getattr(scheduler, "tokenizer", None))
            policy.finish_round(result)
        except Exception:  # the scheduler must go on whatever happens to the records
            log.exception("market plugin: finishing the round failed")
    return None


def after_get_prefill_adder_class(result: type, scheduler: Any, *args: Any, **kwargs: Any) -> type:
    """AFTER hook on ``Scheduler.get_prefill_adder_class``: the in-batch deferring adder."""
    policy = getattr(scheduler, "policy", None)
    if not isinstance(policy, AuctionSchedulePolicy) or policy.market is None:
        return result
    market = policy.market
    if not market.defers_in_batch:
        return result
    tree_cache = getattr(scheduler, "tree_cache", None)
    if tree_cache is not None and tree_cache.supports_mamba():
        return result  # a deferred request would hold its Mamba slot while it waits
    return deferring_adder(result, market)


def deferring_adder(base: type, market: MarketQueue) -> type:
    """A subclass of the admission class ``base`` that defers requests for ``market``.

    A request that shares at least ``in_batch_defer_tokens`` uncached tokens with a request
    already admitted to this batch is skipped (it stays waiting, in its place): the next batch
    finds that prefix in the cache instead of computing it twice now.
    """
    cls = market.adder_classes.get(base)
    if cls is not None:
        return cls
    continue_result = sglang_policy.AddReqResult.CONTINUE

    class AuctionPrefillAdder(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.market_batch = market.begin_batch()

        def add_one_req(self, req: Req, *args: Any, **kwargs: Any) -> Any:
            if market.defer(req, self.market_batch):
                return continue_result
            result = super().add_one_req(req, *args, **kwargs)
            if self.can_run_list and self.can_run_list[-1] is req:
                market.admitted_to_batch(req, self.market_batch)
            return result

    AuctionPrefillAdder.__qualname__ = f"Auction{base.__qualname__}"
    market.adder_classes[base] = AuctionPrefillAdder
    return AuctionPrefillAdder
