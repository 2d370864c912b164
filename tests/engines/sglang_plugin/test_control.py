"""The market's control path into SGLang: the plugin follows the market's control store (a
Redis key), so the console's policy and reserve reach SGLang as
they reach the simulated engine, from the next round; and the checks SGLang itself makes at
startup, the inert class, and a queue the market cannot fully read."""

from __future__ import annotations

import time
import uuid

import pytest
from sglang.srt.managers.schedule_batch import NextBatchPlan, ScheduleBatch
from sglang.srt.managers.schedule_policy import CacheAgnosticPolicy, PrefillAdder, SchedulePolicy

from engines.contract.control import (
    RedisControlStore,
    control_key,
    now_state,
)
from engines.sglang_plugin.config import PluginConfig
from engines.sglang_plugin.policy import AuctionSchedulePolicy
from tests.engines.sglang_plugin.helpers import kv_pool, make_req, market_policy
from tests.engines.sglang_plugin.test_admission import admit


def one_round(pol, allocator, cache, queue):
    """One scheduling round as SGLang runs it: order, admit, finish; returns its record."""
    sink = pol.sink
    before = len(sink.records)
    pol.calc_priority(queue)
    adder, _ = admit(PrefillAdder, allocator, cache, queue)
    pol.finish_round(
        NextBatchPlan(
            batch_to_run=ScheduleBatch(reqs=adder.can_run_list),
            running_batch=ScheduleBatch(reqs=[]),
        )
    )
    assert len(sink.records) == before + 1
    return sink.records[-1]


def two_bidders(tag: str):
    # Disjoint prompts, bids $0.2/s and $0.6/s: under a reserve of $0.5/s the first counts 0.
    return [
        make_req(f"{tag}-lo", [1, 2, 3, 4], bid=0.2, arrival=1.0),
        make_req(f"{tag}-hi", [5, 6, 7, 8], bid=0.6, arrival=2.0),
    ]


def wait_for(predicate, what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def effective(record) -> dict[str, float]:
    return {a["request_id"]: a["effective_bid"] for a in record["admitted"]}


def check_follows(store, pol, allocator, cache) -> None:
    # The state written before the engine started is in effect from its first round.
    first = one_round(pol, allocator, cache, two_bidders("a"))
    assert (first["policy"], first["reserve"]) == ("highest-bid", 0.5)
    assert effective(first) == {"a-lo": 0.0, "a-hi": 0.6}
    # The operator changes both; the next round after the follower has read it runs them.
    store.write(now_state("dfs-auction", 0.0))
    wait_for(lambda: pol.control.changes == 2, "the follower to read the change")
    second = one_round(pol, allocator, cache, two_bidders("b"))
    assert (second["policy"], second["reserve"]) == ("dfs-auction", 0.0)
    assert effective(second) == {"b-lo": 0.2, "b-hi": 0.6}
    assert pol.market.control_applied == 2
    # The wait bound travels with them, from the next round.
    store.write(now_state("dfs-auction", 0.0, wait_bound_s=30))
    wait_for(lambda: pol.control.changes == 3, "the follower to read the wait bound")
    assert pol.market.config.knobs.wait_bound_s == 0.0  # not before a round
    one_round(pol, allocator, cache, two_bidders("w"))
    assert pol.market.config.knobs.wait_bound_s == 30.0
    assert pol.market.wait_bound.credit.wait_s == 30.0  # the round ran under it
    # A state the plugin cannot run (SGLang's own policy, a negative reserve, not JSON) is
    # refused whole and counted; the values in effect stay.
    refused = pol.control.refused
    store.write(now_state("lpm", 0.1))
    wait_for(lambda: pol.control.refused > refused, "the follower to refuse lpm")
    third = one_round(pol, allocator, cache, two_bidders("c"))
    assert (third["policy"], third["reserve"]) == ("dfs-auction", 0.0)


def test_the_console_reaches_sglang_through_redis() -> None:
    from django.conf import settings

    market = f"m-{uuid.uuid4().hex[:8]}"
    store = RedisControlStore(settings.REDIS_URL, market)
    assert store.key == control_key(market)
    try:
        store.write(now_state("highest-bid", 0.5))
        allocator, cache = kv_pool(1_000)
        pol, _ = market_policy(
            "dfs-auction-density",
            cache,
            market=market,
            redis_url=settings.REDIS_URL,
            control_poll_s=0.02,
        )
        try:
            check_follows(store, pol, allocator, cache)
            store.client.set(store.key, b"{not json")
            refused = pol.control.refused
            wait_for(lambda: pol.control.refused > refused, "the follower to refuse bad JSON")
            assert pol.market.policy == "dfs-auction"
        finally:
            pol.control.stop()
    finally:
        store.client.delete(store.key)


def test_without_a_store_the_configured_values_stay() -> None:
    allocator, cache = kv_pool(1_000)
    pol, _ = market_policy("highest-bid", cache, reserve=0.5)
    assert pol.control is None
    record = one_round(pol, allocator, cache, two_bidders("x"))
    assert (record["policy"], record["reserve"]) == ("highest-bid", 0.5)


def test_a_dead_store_leaves_the_values_in_effect(tmp_path) -> None:
    from tests.conftest import dead_port

    allocator, cache = kv_pool(1_000)
    pol, _ = market_policy(
        "highest-bid",
        cache,
        reserve=0.5,
        redis_url=f"redis://127.0.0.1:{dead_port()}/0",
        control_poll_s=0.02,
    )
    try:
        assert pol.control.read_errors >= 1  # the read at start failed, and did not raise
        record = one_round(pol, allocator, cache, two_bidders("d"))
        assert (record["policy"], record["reserve"]) == ("highest-bid", 0.5)
    finally:
        pol.control.stop()


@pytest.mark.parametrize("policy", ["dfs-auction", "highest-bid", "lpm", "dfs-weight"])
def test_priority_scheduling_needs_fcfs_or_lof_as_in_sglang(policy: str) -> None:
    _, cache = kv_pool(100)
    with pytest.raises(ValueError, match="priority scheduling needs policy fcfs or lof"):
        AuctionSchedulePolicy(
            "fcfs", cache, False, True, False, market_config=PluginConfig(policy=policy)
        )


@pytest.mark.parametrize("policy", ["fcfs", "lof", None])
def test_priority_scheduling_runs_with_fcfs_lof_or_no_market_policy(policy) -> None:
    _, cache = kv_pool(100)
    pol = AuctionSchedulePolicy(
        "fcfs", cache, False, True, False, market_config=PluginConfig(policy=policy)
    )
    assert pol.market is None and pol.enable_priority_scheduling


@pytest.mark.parametrize("cls", [SchedulePolicy, AuctionSchedulePolicy])
def test_an_object_made_without_init_runs_sglangs_policy(cls) -> None:
    """SGLang's own tests make policies with ``object.__new__`` and set what they use; ours
    then behaves as SGLang's class does."""
    _, cache = kv_pool(100)
    pol = object.__new__(cls)
    pol.policy = CacheAgnosticPolicy.FCFS
    pol.tree_cache = cache
    pol.enable_priority_scheduling = True
    pol.priority_sign = 1
    pol._waiting_prefix_refresh_calls = 0
    pol._shortest_prefill_calls = 0
    queue = [
        make_req("late", [1, 2], arrival=2.0, priority=0),
        make_req("urgent", [3, 4], arrival=3.0, priority=-5),
        make_req("early", [5, 6], arrival=1.0, priority=0),
    ]
    pol.calc_priority(queue)
    # SGLang's rule with low values first: priority, then arrival.
    assert [r.rid for r in queue] == ["urgent", "early", "late"]
    assert getattr(pol, "market", None) is None


def test_a_request_the_market_cannot_read_is_served_in_queue_order_and_counted_once() -> None:
    allocator, cache = kv_pool(1_000)
    pol, _ = market_policy("highest-bid", cache)
    odd = make_req("placeholder", [9, 9, 9], bid=5.0, arrival=0.5)
    odd.rid = 12345  # not a string: the market cannot key its tree by it
    queue = [make_req("lo", [1, 2, 3], bid=0.1), odd, make_req("hi", [4, 5, 6], bid=0.9)]
    pol.calc_priority(queue)
    assert [r.rid for r in queue] == [12345, "hi", "lo"]  # outside the auction, then by bid
    pol.calc_priority(queue)
    assert pol.market.unreadable == 1 and pol.market.order_errors == 0
