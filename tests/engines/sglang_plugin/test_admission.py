"""Admission: SGLang's real ``PrefillAdder`` takes the plugin's order, and each round's admitted
requests are priced from that round's plan and reported in a valid round record.

The admission loop is the one of ``Scheduler._get_new_batch_prefill_raw`` (budget check,
``init_next_round_input``, ``add_one_req``, stop at the first result that is not CONTINUE),
over a real CPU KV allocator and a radix cache whose cached prefixes hold real KV slots.
"""

from __future__ import annotations

import random

import pytest
from sglang.srt.managers.schedule_batch import NextBatchPlan, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

from engines.contract.records import (
    round_record_checked,
    round_record_dumps,
    round_record_loads,
)
from engines.sglang_plugin.policy import deferring_adder
from mechanism import clear
from tests.engines.sglang_plugin.helpers import (
    PromptSource,
    cache_insert,
    kv_pool,
    make_req,
    market_policy,
    waiting_requests,
)

MARKET = ("dfs-auction", "dfs-auction-density", "highest-bid")


def admit(adder_class, allocator, cache, queue, *, rem_input=16_384, rem_chunk=None):
    """SGLang's admission loop over the ordered queue; returns the adder and the last result."""
    adder = adder_class(
        page_size=1,
        tree_cache=cache,
        token_to_kv_pool_allocator=allocator,
        running_batch=ScheduleBatch(reqs=[]),
        new_token_ratio=0.7,
        rem_input_tokens=rem_input,
        rem_chunk_tokens=rem_chunk,
    )
    result = AddReqResult.CONTINUE
    for req in queue:
        if adder.budget_state() == AddReqResult.OTHER:
            result = AddReqResult.OTHER
            break
        req.init_next_round_input(cache)
        result = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
        if result != AddReqResult.CONTINUE:
            break
    return adder, result


def _scenario(seed: int, pool: int):
    rng = random.Random(seed)
    source = PromptSource(rng)
    allocator, cache = kv_pool(pool)
    prompts = [source.prompt() for _ in range(rng.randint(5, 40))]
    for p in rng.sample(prompts, len(prompts) // 3):
        cache_insert(cache, p[: rng.randint(1, len(p) - 1)], allocator)
    queue = [
        make_req(
            f"a{seed}-{i}", p, bid=rng.choice([0.0, 0.5, 1.0, rng.uniform(0, 2)]), arrival=i + 1.0
        )
        for i, p in enumerate(prompts)
    ]
    return rng, allocator, cache, queue


@pytest.mark.parametrize("policy", MARKET)
@pytest.mark.parametrize("seed", range(10))
def test_prefill_adder_admits_in_our_order(policy: str, seed: int) -> None:
    rng, allocator, cache, queue = _scenario(seed, pool=rng_pool(seed))
    pol, _ = market_policy(policy, cache)
    pol.calc_priority(queue)
    order = [r.rid for r in queue]
    overhead = pol.market_config.knobs.overhead_tokens
    assert order == clear(waiting_requests(queue, cache), policy, overhead_tokens=overhead).order
    rem_input = rng.choice([16_384, 300, 120])
    adder, result = admit(PrefillAdder, allocator, cache, queue, rem_input=rem_input)
    admitted = [r.rid for r in adder.can_run_list]
    assert admitted == order[: len(admitted)] and admitted  # a prefix of our order
    if len(admitted) < len(order):  # stopped by SGLang's budget, head of line
        assert result in (AddReqResult.NO_TOKEN, AddReqResult.OTHER)


def rng_pool(seed: int) -> int:
    """KV pools from roomy to tight, so that memory stops some admissions."""
    return (20_000, 2_000, 600)[seed % 3]


def test_deferring_adder_keeps_a_shared_uncached_prefix_out_of_the_batch() -> None:
    allocator, cache = kv_pool(10_000)
    system = list(range(100, 164))  # 64 tokens, not cached yet
    cache_insert(cache, [1, 2, 3], allocator)
    queue = [
        make_req("s1", system + [1], bid=1.0, arrival=1.0),
        make_req("s2", system + [2], bid=1.0, arrival=2.0),
        make_req("short-shared", system[:20] + [3], bid=1.0, arrival=3.0),
        make_req("cached-head", [1, 2, 3, 4], bid=0.1, arrival=4.0),
        make_req("alone", [7, 7, 7], bid=0.1, arrival=5.0),
    ]
    pol, _ = market_policy("dfs-auction", cache)
    pol.calc_priority(queue)
    order = [r.rid for r in queue]
    adder_class = deferring_adder(PrefillAdder, pol.market)
    assert issubclass(adder_class, PrefillAdder)
    adder, _ = admit(adder_class, allocator, cache, queue)
    admitted = [r.rid for r in adder.can_run_list]
    # s2 would compute the same 64 uncached tokens as s1: it waits for the next batch, which
    # finds them cached. short-shared shares only 20 (< 32) and goes now; the rest too.
    assert "s2" not in admitted
    assert admitted == [rid for rid in order if rid != "s2"]


@pytest.mark.parametrize("policy", MARKET)
@pytest.mark.parametrize("seed", range(6))
def test_round_record_prices_the_admitted_from_the_round(policy: str, seed: int) -> None:
    rng, allocator, cache, queue = _scenario(seed + 100, pool=20_000)
    reserve = rng.choice([0.0, 0.4])
    tps, overhead = 5_000.0, 2
    pol, sink = market_policy(
        policy,
        cache,
        reserve=reserve,
        tokens_per_second=tps,
        overhead_tokens=overhead,
        market="m1",
        engine_id="sglang-test",
    )
    # The prices the record must carry, from an independent clearing of the same queue.
    expected = clear(
        waiting_requests(queue, cache),
        policy,
        reserve=reserve,
        tokens_per_second=tps,
        overhead_tokens=overhead,
    )
    pol.calc_priority(queue)
    adder, _ = admit(PrefillAdder, allocator, cache, queue, rem_input=rng.choice([400, 2_000]))
    running = ScheduleBatch(reqs=[])
    pol.finish_round(
        NextBatchPlan(batch_to_run=ScheduleBatch(reqs=adder.can_run_list), running_batch=running)
    )
    (record,) = sink.records
    assert round_record_loads(round_record_dumps(round_record_checked(record))) == record
    assert record["engine"] == "sglang-test" and record["market"] == "m1"
    assert record["policy"] == policy and record["reserve"] == reserve
    assert record["waiting"] == len(queue) and record["tokens_per_second"] == tps
    assert record["subtrees"], "the first round carries the order book"
    admitted = adder.can_run_list
    assert [a["request_id"] for a in record["admitted"]] == [r.rid for r in admitted]
    charged = 0
    for entry, req in zip(record["admitted"], admitted, strict=True):
        rid = req.rid
        assert entry["position"] == expected.order.index(rid)
        assert entry["charge"] == pytest.approx(expected.charge(rid), rel=1e-9, abs=1e-15)
        assert entry["time_saved_s"] == pytest.approx(expected.time_saved(rid), rel=1e-9)
        assert entry["planned_completion_s"] == pytest.approx(expected.completion[rid], rel=1e-12)
        assert entry["prompt_tokens"] == len(req.origin_input_ids)
        assert entry["cached_tokens"] == req.prefix_len
        charged += entry["charge"] > 0
    # The admitted left the market; the rest wait in the same order.
    assert all(r.rid not in pol.market.tree for r in admitted)
    assert len(pol.market.tree) == len(queue) - len(admitted)
    pol.finish_round(None)  # a prefill attempt that admitted no one: no record
    assert len(sink.records) == 1


def test_rank_is_the_place_in_line_when_a_round_first_ordered_the_request() -> None:
    # The simulated engine's hand-worked case (tests/engines/sim/test_engine.py, same name), in
    # SGLang's queue: one 10-token prompt admitted a round, work = uncached tokens + 1 overhead
    # token a request, dfs-auction-density. Round 1 orders p1 p2 b d c a (the shared subtree of
    # p1 and p2: 0.06 / 14 tokens, ahead of b's 0.04 / 11); round 2 first orders e and f, which
    # arrived meanwhile: e b d c f a p2 (p2 bids 0; nothing was prefilled, so its prefix is
    # uncached still: 0 / 11). Both engines report the same places.
    allocator, cache = kv_pool(4_096)
    pol, sink = market_policy("dfs-auction-density", cache, overhead_tokens=1)
    shared = list(range(100, 108))
    queue = [
        make_req("p1", [*shared, 200, 201], bid=0.06, arrival=1.0),
        make_req("p2", [*shared, 300, 301], bid=0.0, arrival=1.0),
        make_req("a", range(10, 20), bid=0.01, arrival=1.0),
        make_req("b", range(20, 30), bid=0.04, arrival=1.0),
        make_req("c", range(30, 40), bid=0.02, arrival=1.0),
        make_req("d", range(40, 50), bid=0.03, arrival=1.0),
    ]
    later = [
        make_req("e", range(50, 60), bid=0.05, arrival=1.5),
        make_req("f", range(60, 70), bid=0.015, arrival=1.5),
    ]
    while queue or later:
        pol.calc_priority(queue)
        adder, _ = admit(PrefillAdder, allocator, cache, queue, rem_input=10)
        assert len(adder.can_run_list) == 1
        pol.finish_round(
            NextBatchPlan(
                batch_to_run=ScheduleBatch(reqs=adder.can_run_list),
                running_batch=ScheduleBatch(reqs=[]),
            )
        )
        queue = [r for r in queue if r not in adder.can_run_list] + later  # as the scheduler
        later = []
    got = {
        a["request_id"]: (a["rank"], a["ahead"], a["queue_len"])
        for record in sink.records
        for a in record["admitted"]
    }
    assert got == {
        "p1": (1, 0, 6),
        "p2": (2, 1, 6),
        "b": (3, 2, 6),
        "d": (4, 3, 6),
        "c": (5, 4, 6),
        "a": (6, 5, 6),
        "e": (1, 0, 7),
        "f": (5, 4, 7),
    }
    assert {a["position"] for record in sink.records for a in record["admitted"]} == {0}


def test_some_rounds_charge_something() -> None:
    """The record tests above are not all zeros: bids buy priority and pay for it."""
    charges = []
    for seed in range(6):
        rng, allocator, cache, queue = _scenario(seed + 100, pool=20_000)
        pol, sink = market_policy("dfs-auction-density", cache)
        pol.calc_priority(queue)
        adder, _ = admit(PrefillAdder, allocator, cache, queue, rem_input=400)
        pol.finish_round(
            NextBatchPlan(
                batch_to_run=ScheduleBatch(reqs=adder.can_run_list),
                running_batch=ScheduleBatch(reqs=[]),
            )
        )
        charges += [a["charge"] for a in sink.records[0]["admitted"]]
    assert sum(c > 0 for c in charges) >= 3


class _Letters:
    """A tokenizer stand-in: token i decodes to the letter a+i (what the labels show)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + i % 26) for i in ids)


def test_order_book_labels_decode_with_the_schedulers_tokenizer() -> None:
    allocator, cache = kv_pool(1_000)
    pol, sink = market_policy("dfs-auction", cache, book_interval_s=0.0)
    queue = [
        make_req("x", [7, 4, 11, 11, 14, 1], bid=1.0, arrival=1.0),
        make_req("y", [7, 4, 11, 11, 14, 2], bid=0.5, arrival=2.0),
    ]
    pol.calc_priority(queue)
    adder, _ = admit(PrefillAdder, allocator, cache, queue)
    pol.adopt_tokenizer(_Letters())
    pol.finish_round(
        NextBatchPlan(
            batch_to_run=ScheduleBatch(reqs=adder.can_run_list),
            running_batch=ScheduleBatch(reqs=[]),
        )
    )
    (record,) = sink.records
    top = [row for row in record["subtrees"] if row["depth"] == 1]
    assert [(row["label"], row["requests"], row["bid_sum"]) for row in top] == [("hello", 2, 1.5)]


def test_a_round_record_carries_its_epoch_and_each_requests_block() -> None:
    """The one record writer, in SGLang: ``epoch`` names the run, ``block`` the top-level
    subtree a request waited in. By hand: x ($1/s) and y ($0.5/s) share a 5-token head and
    differ in their last token; nothing is cached, overhead 1 token per request, so the block
    is the head's subtree: 2 requests, mean bid 0.75, work 5 + 1 + 1 + 2 x 1 = 9 tokens,
    density 1.5 / 9 $/s per token."""
    allocator, cache = kv_pool(1_000)
    pol, sink = market_policy("dfs-auction", cache, engine_id="sglang-test", overhead_tokens=1)
    queue = [
        make_req("x", [7, 4, 11, 11, 14, 1], bid=1.0, arrival=1.0),
        make_req("y", [7, 4, 11, 11, 14, 2], bid=0.5, arrival=2.0),
    ]
    pol.calc_priority(queue)
    adder, _ = admit(PrefillAdder, allocator, cache, queue)
    pol.finish_round(
        NextBatchPlan(
            batch_to_run=ScheduleBatch(reqs=adder.can_run_list),
            running_batch=ScheduleBatch(reqs=[]),
        )
    )
    (record,) = sink.records
    assert round_record_checked(record) is record
    epoch = record["epoch"]
    assert epoch and record["seq"] == 1 and record["round_id"] == f"sglang-test:{epoch}:1"
    assert [a["request_id"] for a in record["admitted"]] == ["x", "y"]
    for entry in record["admitted"]:
        assert entry["block"] == {
            "prefix_tokens": 5,
            "requests": 2,
            "bid_mean": pytest.approx(0.75),
            "density": pytest.approx(1.5 / 9),
        }


def test_a_retracted_request_is_not_charged_twice() -> None:
    """It paid in the round that first admitted it; admitted again, it is not in the record."""
    allocator, cache = kv_pool(1_000)
    pol, sink = market_policy("highest-bid", cache)
    first = make_req("again", [1, 2, 3], bid=2.0, arrival=1.0)
    other = make_req("other", [4, 5, 6], bid=1.0, arrival=2.0)
    first.retracted_stain = True  # SGLang's mark of a request it once retracted
    queue = [other, first]
    pol.calc_priority(queue)
    adder, _ = admit(PrefillAdder, allocator, cache, queue)
    assert [r.rid for r in adder.can_run_list] == ["again", "other"]
    plan = NextBatchPlan(
        batch_to_run=ScheduleBatch(reqs=adder.can_run_list), running_batch=ScheduleBatch(reqs=[])
    )
    pol.finish_round(plan)
    (record,) = sink.records
    assert [a["request_id"] for a in record["admitted"]] == ["other"]
    assert len(pol.market.tree) == 0
