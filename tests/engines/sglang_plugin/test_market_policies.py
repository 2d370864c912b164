"""The plugin's ``calc_priority`` on real SGLang requests and a real ``RadixCache``.

- the market's policies order the queue exactly as ``mechanism.clear`` orders the same
  requests, round after round, while requests arrive, leave, are admitted, come back retracted
  and the cache grows (the plugin keeps its request tree incrementally; ``clear`` starts afresh);
- SGLang's own policies run unchanged through the plugin's class;
- a bad bid fails that request alone, the way SGLang fails a queued request.
"""

from __future__ import annotations

import math
import random
from array import array

import pytest
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.mem_cache.radix_cache import RadixCache

from engines.sglang_plugin.config import PluginConfig
from engines.sglang_plugin.policy import AuctionSchedulePolicy
from mechanism import MAX_BID, clear
from tests.engines.sglang_plugin.helpers import (
    PromptSource,
    cache_insert,
    make_req,
    market_policy,
    waiting_requests,
)

MARKET = (
    "dfs-auction",
    "dfs-auction-density",
    "dfs-auction-kv",
    "dfs-auction-kv-split",
    "highest-bid",
)


def _bid(rng: random.Random) -> object:
    return rng.choice([0.0, 0.0, 0.25, 0.5, 1.0, 2.0, rng.uniform(0.0, 3.0), 7])


@pytest.mark.parametrize("policy", MARKET)
@pytest.mark.parametrize("seed", range(12))
def test_market_order_equals_the_mechanism_round_after_round(policy: str, seed: int) -> None:
    rng = random.Random(seed)
    source = PromptSource(rng, unique_tail=rng.random() < 0.5)
    cache = RadixCache.create_simulated()
    reserve = rng.choice([0.0, 0.0, 0.5])
    overhead = rng.choice([0, 1, 8])
    pol, _ = market_policy(policy, cache, reserve=reserve, overhead_tokens=overhead)
    queue: list = []
    admitted: list = []
    clock = 0.0
    rounds = made = 0
    for _ in range(8):
        for _ in range(rng.randint(0, 3)):  # the cache grows: prefixes of waiting prompts too
            if queue and rng.random() < 0.7:
                p = list(rng.choice(queue).origin_input_ids)
                cache_insert(cache, p[: rng.randint(1, len(p))])
            else:
                cache_insert(cache, source.prompt())
        for _ in range(rng.choice([0, 1, 5, 20, 60])):
            clock += rng.choice([0.0, 1.0])  # equal arrivals: ties go to the smaller id
            made += 1
            rid = f"s{seed}-{rng.randint(0, 10**6)}-{made}"  # ids not in arrival order
            queue.append(make_req(rid, source.prompt(), bid=_bid(rng), arrival=clock + 1.0))
        if admitted and rng.random() < 0.5:  # a retracted request waits again, with output
            back = admitted.pop(rng.randrange(len(admitted)))
            back.output_ids = array("q", [rng.randint(0, 3) for _ in range(rng.randint(1, 4))])
            back.retracted_stain = True
            back.time_stats.wait_queue_entry_time = 0.0
            back.time_stats.set_wait_queue_entry_time(clock + 1.5)
            queue.append(back)
        if queue and rng.random() < 0.3:  # a client went away
            queue.pop(rng.randrange(len(queue)))
        pol.calc_priority(queue)
        expected = clear(
            waiting_requests(queue, cache), policy, reserve=reserve, overhead_tokens=overhead
        )
        assert [r.rid for r in queue] == expected.order
        rounds += bool(queue)
        k = rng.randint(0, min(4, len(queue)))
        # Admitted as SGLang admits: the round's hook (after_get_new_batch_prefill) sees the
        # batch, before any of it can come back retracted.
        pol.market.finish_round(queue[:k])
        admitted.extend(queue[:k])
        del queue[:k]
    assert rounds >= 4
    pol.calc_priority(queue)  # the ones whose client went away leave it when it next looks
    assert len(pol.market.tree) == len(queue)


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight", "fcfs", "lof", "hrrn"])
@pytest.mark.parametrize("how", ["unset", "named"])
def test_sglang_policies_run_unchanged(policy: str, how: str) -> None:
    """With no market policy (or one of SGLang's named), the plugin's class is SGLang's."""
    rng = random.Random(7)
    source = PromptSource(rng)
    caches = [RadixCache.create_simulated(), RadixCache.create_simulated()]
    if how == "unset":
        ours = AuctionSchedulePolicy(
            policy, caches[0], False, False, False, market_config=PluginConfig()
        )
    else:  # MARKET_POLICY names it; SGLang's --schedule-policy said something else
        ours = AuctionSchedulePolicy(
            "fcfs", caches[0], False, False, False, market_config=PluginConfig(policy=policy)
        )
    theirs = SchedulePolicy(policy, caches[1], False, False, False)
    assert ours.market is None and ours.policy == theirs.policy
    queues: list[list] = [[], []]
    for round_ in range(5):
        prompt = source.prompt()
        for cache in caches:
            cache_insert(cache, prompt[: len(prompt) // 2])
        for i in range(rng.choice([3, 30, 140])):
            p = source.prompt()
            for q in queues:
                q.append(make_req(f"r{round_}-{i}", p, arrival=round_ * 1000 + i + 1.0))
        ours.calc_priority(queues[0], None, 100)
        theirs.calc_priority(queues[1], None, 100)
        assert [r.rid for r in queues[0]] == [r.rid for r in queues[1]]
        assert [r.prefix_len for r in queues[0]] == [r.prefix_len for r in queues[1]]
        assert ours.waiting_queue_prefix_matched(queues[0]) == theirs.waiting_queue_prefix_matched(
            queues[1]
        )
        for q in queues:
            del q[: len(q) // 3]


# (A JSON null is no bid, as in the engine contract's one reading: see the bid-zero test.)
BAD_BIDS = [-1, -0.01, math.nan, math.inf, -math.inf, "1.5", True, [1], MAX_BID * 2]


@pytest.mark.parametrize("policy", MARKET)
def test_a_bad_bid_fails_that_request_only(policy: str) -> None:
    cache = RadixCache.create_simulated()
    cache_insert(cache, list(range(1, 40)))
    pol, _ = market_policy(policy, cache)
    good = [
        make_req("plain", list(range(1, 50)), arrival=1.0),
        make_req("rich", [7, 8, 9], bid=2.5, arrival=2.0),
        make_req("cheap", list(range(1, 45)), bid=0.1, arrival=3.0),
        make_req("max", [5, 5], bid=MAX_BID, arrival=4.0),
    ]
    bad = [make_req(f"bad{i}", [9, i], bid=b, arrival=5.0 + i) for i, b in enumerate(BAD_BIDS)]
    queue = [good[0], bad[0], good[1], *bad[1:], good[2], good[3]]
    overhead = pol.market_config.knobs.overhead_tokens
    expected = clear(waiting_requests(good, cache), policy, overhead_tokens=overhead).order
    pol.calc_priority(queue)
    # The failing requests go first: SGLang runs each as a one-token prefill and returns its
    # error to the client; the others are ordered as if the failing ones never came.
    assert [r.rid for r in queue] == [r.rid for r in bad] + expected
    for req in bad:
        reason = req.to_finish
        assert isinstance(reason, FINISH_ABORT), req.rid
        assert reason.status_code == 400
        assert "bid" in reason.message and req.rid in reason.message, reason.message
        assert list(req.origin_input_ids) == [0]  # SGLang's cheap one-token abort
        req.update_finish_state()  # what the scheduler does after that prefill
        assert req.finished() and req.finished_reason.to_json()["message"] == reason.message
    assert all(r.to_finish is None for r in good)
    assert pol.market.bad_bids == len(BAD_BIDS)
    assert "must be >= 0" in bad[0].finished_reason.message
    assert "above the maximum" in bad[-1].finished_reason.message
    # Next round: nothing is failed twice, the market still holds exactly the good requests.
    queue = [r for r in queue if not r.finished()]
    pol.calc_priority(queue)
    assert [r.rid for r in queue] == expected
    assert pol.market.bad_bids == len(BAD_BIDS) and len(pol.market.tree) == len(good)


def test_custom_params_without_a_bid_bid_zero() -> None:
    cache = RadixCache.create_simulated()
    pol, _ = market_policy("highest-bid", cache)
    other = make_req("other", [1, 2], arrival=1.0)
    other.sampling_params.custom_params = {"temperature_hint": 3}
    null = make_req("null", [5, 6], bid=None, arrival=3.0)
    queue = [other, make_req("bidder", [3, 4], bid=0.5, arrival=2.0), null]
    pol.calc_priority(queue)
    assert [r.rid for r in queue] == ["bidder", "other", "null"]
    assert pol.market.tree.get("other").bid == 0.0 == pol.market.tree.get("null").bid


def test_a_growing_cache_reorders_by_density() -> None:
    """The plugin re-matches waiting requests every round: newly cached tokens count."""
    cache = RadixCache.create_simulated()
    pol, _ = market_policy("dfs-auction-density", cache, overhead_tokens=0)
    long = make_req("long", [1] * 100 + [2], bid=1.0, arrival=1.0)  # density 1/101 per token
    short = make_req("short", [3] * 50 + [4], bid=0.6, arrival=2.0)  # 0.6/51
    queue = [long, short]
    pol.calc_priority(queue)
    assert [r.rid for r in queue] == ["short", "long"]
    cache_insert(cache, [1] * 90)  # now "long" needs 11 tokens: density 1/11
    pol.calc_priority(queue)
    assert [r.rid for r in queue] == ["long", "short"]
    assert pol.market.tree.get("long").cached_len == 90 == long.num_matched_prefix_tokens


def test_a_retracted_request_waits_again_with_its_output() -> None:
    cache = RadixCache.create_simulated()
    pol, _ = market_policy("dfs-auction", cache)
    req = make_req("r", [5, 6, 7], bid=1.0, arrival=1.0)
    other = make_req("o", [5, 6, 9], bid=0.5, arrival=2.0)
    queue = [req, other]
    pol.calc_priority(queue)
    queue.remove(req)  # admitted ...
    pol.calc_priority(queue)
    assert "r" not in pol.market.tree
    req.output_ids = array("q", [8, 8])  # ... retracted after two tokens, queued again
    req.time_stats.wait_queue_entry_time = 0.0
    req.time_stats.set_wait_queue_entry_time(3.0)
    queue.append(req)
    pol.calc_priority(queue)
    assert tuple(pol.market.tree.get("r").tokens) == (5, 6, 7, 8, 8)
    assert pol.market.tree.get("r").arrival == 3.0
    assert [r.rid for r in queue] == ["r", "o"]


def test_a_request_aborted_while_waiting_leaves_the_market_unpriced() -> None:
    cache = RadixCache.create_simulated()
    pol, sink = market_policy("dfs-auction", cache)
    queue = [make_req(rid, [i, 1], bid=1.0 + i, arrival=i + 1.0) for i, rid in enumerate("abc")]
    pol.calc_priority(queue)
    assert [r.rid for r in queue] == ["c", "b", "a"]
    queue[1].set_finish_with_abort("the client went away")  # aborted in place, not popped
    pol.calc_priority(queue)
    pol.market.finish_round(queue[:2])  # admitted: SGLang finishes "b" with its error
    (record,) = sink.records
    assert [a["request_id"] for a in record["admitted"]] == ["c"]  # "b" is not charged
    assert "b" not in pol.market.tree and len(pol.market.tree) == 1


def test_a_request_aborted_on_arrival_waits_at_the_front_outside_the_market() -> None:
    cache = RadixCache.create_simulated()
    pol, _ = market_policy("dfs-auction", cache)
    queue = [make_req(rid, [i, 1], bid=1.0 + i, arrival=i + 1.0) for i, rid in enumerate("abc")]
    queue[0].set_finish_with_abort("multimodal input failed")  # as SGLang queues such requests
    pol.calc_priority(queue)
    assert [r.rid for r in queue] == ["a", "c", "b"]
    assert "a" not in pol.market.tree


def test_the_wait_bound_serves_an_old_request_ahead_after_the_bound_not_before() -> None:
    """The hand-worked case of tests/engines/sim/test_wait_bound.py, run by the plugin through
    the same rule (``mechanism.aging.WaitBound``), each time 1 s later (SGLang's clock of queue
    entry starts above 0). Bound 2 s in 2 steps, $0.095/s per prompt token at the bound, plan
    at 100 tokens/s, no overhead. ``old`` (100 tokens, $0.8/s, in at 1 s) is behind ``a``
    (10 tokens, $1/s: key 0.1) at 2 s, with half its credit (key 0.0555); at 3 s, with all of
    it (key 0.103), it passes ``b`` and ``c`` and pays its critical bid $0.5/s x the 0.2 s it
    saves: $0.10."""
    cache = RadixCache.create_simulated()
    pol, sink = market_policy(
        "dfs-auction-density", cache, overhead_tokens=0, tokens_per_second=100.0,
        wait_bound_s=2.0, wait_steps=2, wait_density=0.095,
    )  # fmt: skip
    market = pol.market
    queue = [
        make_req("old", range(1000, 1100), bid=0.8, arrival=1.0),
        make_req("a", range(2000, 2010), bid=1.0, arrival=1.5),
    ]
    market.order(queue, now=2.0)
    assert [r.rid for r in queue] == ["a", "old"]
    market.finish_round(queue[:1])
    del queue[0]
    queue += [
        make_req("b", range(3000, 3010), bid=1.0, arrival=2.5),
        make_req("c", range(4000, 4010), bid=1.0, arrival=2.9),
    ]
    market.order(queue, now=3.0)
    assert [r.rid for r in queue] == ["old", "b", "c"]
    market.finish_round(queue[:1])
    (entry,) = sink.records[-1]["admitted"]
    assert entry["request_id"] == "old" and entry["bid"] == 0.8 and entry["age_credit"] == 9.5
    assert entry["charge"] == pytest.approx(0.10) and entry["time_saved_s"] == pytest.approx(0.2)
    # Without the bound the same queue keeps old behind both.
    plain, _ = market_policy(
        "dfs-auction-density", RadixCache.create_simulated(), overhead_tokens=0,
        tokens_per_second=100.0,
    )  # fmt: skip
    again = [make_req(r.rid, list(r.origin_input_ids), bid=r.sampling_params.custom_params["bid"],
                      arrival=r.time_stats.wait_queue_entry_time) for r in queue]  # fmt: skip
    plain.market.order(again, now=3.0)
    assert [r.rid for r in again] == ["b", "c", "old"]


def test_calc_priority_ages_requests_on_sglangs_clock_of_queue_entry() -> None:
    """Through SGLang's own call (``calc_priority``, no ``now``): the round reads
    ``time.perf_counter``, the clock SGLang stamps ``wait_queue_entry_time`` with. A request in
    for 10 s is past a bound of 1 s (one step); one just in is not. No overhead per request."""
    import time

    cache = RadixCache.create_simulated()
    pol, _ = market_policy(
        "dfs-auction-density", cache, wait_bound_s=1.0, wait_steps=1, wait_density=0.05,
        overhead_tokens=0,
    )  # fmt: skip
    start = time.perf_counter()
    queue = [
        make_req("waited", [1, 2, 3, 4], bid=0.0, arrival=start - 10.0),
        make_req("fresh", [5, 6, 7, 8], bid=0.1, arrival=start),
    ]
    pol.calc_priority(queue)
    # 4 tokens x $0.05/s per token at the bound: $0.2/s.
    assert pol.market.tree.entries["waited"].credit == 200_000_000
    assert pol.market.tree.entries["fresh"].credit == 0
    # Keys: waited (0 + 0.2) / 4 = 0.05 ahead of fresh 0.1 / 4 = 0.025 (behind without it).
    assert [r.rid for r in queue] == ["waited", "fresh"]
