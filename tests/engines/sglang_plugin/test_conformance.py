"""mechanism's bid-blind policies order a queue exactly as SGLang 0.5.23 itself does.

For each policy, 1,000 random queues of real ``Req``s over a real ``RadixCache``: requests share
prefixes (heads of 5 to 40 tokens, some around SGLang's in-batch threshold of 32) and have
partly cached prefixes. SGLang's ``SchedulePolicy.calc_priority`` orders the queue; the
mechanism's ``clear`` orders ``WaitingRequest``s built from the same requests, with cached
lengths from an independent match on the cache.

Where SGLang's semantics differ on purpose, the queues are built so that the comparison means
something; the differences, by name:

- **persistent-queue ties**: SGLang sorts its one waiting list in place (stable sorts), so ties
  keep the previous round's order; the mechanism breaks ties by (arrival, id). Each queue here is
  fresh and in arrival order, as the scheduler appends new requests.
- **lpm fallback**: SGLang's lpm does not sort at all above 128 waiting requests (it turns into
  fcfs); the mechanism's lpm always sorts. lpm queues here hold 1 to 128 requests.
- **lpm cap**: SGLang runs its in-batch check on the uncapped device match but sorts by the match
  capped at all-but-one token; the mechanism has one ``cached_len``. No prompt here is cached
  whole (each ends with a token of its own), where the two agree.
- **dfs-weight child order**: SGLang breaks equal subtree weights by the order in which its radix
  cache created the children; the mechanism by the subtree's earliest arrival. The cache here is
  built by inserting each request's cached prefix in arrival order, where the two agree.
- **dfs-weight groups cached prefixes only**: SGLang walks its KV cache tree, so requests that
  share only an uncached prefix are not grouped; the mechanism's dfs-weight anchors each request
  at the end of its cached prefix to match (its DFS auctions group the whole request tree).
- **fcfs never sorts**: SGLang's fcfs keeps the append order; the mechanism sorts by arrival.
  They agree because the scheduler stamps the queue entry time at append.
- **highest-bid is priority scheduling**: SGLang's fcfs with ``--enable-priority-scheduling`` and
  priority = bid (an integer there) orders by priority, then queue entry time; that is the
  mechanism's highest-bid. Those queues are shuffled: SGLang's key decides the whole order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.mem_cache.radix_cache import RadixCache

from mechanism import WaitingRequest, clear
from tests.engines.sglang_plugin.helpers import (
    PromptSource,
    bid_value,
    cache_in_arrival_order,
    make_req,
    tokens_of,
)

QUEUES = 1_000
SIZES = (1, 2, 3, 5, 8, 13, 20, 32, 50, 80, 128)
# SGLang's policy (and whether priority scheduling is on) -> the mechanism's policy.
COMPARED = {
    ("lpm", False): "lpm",
    ("dfs-weight", False): "dfs-weight",
    ("fcfs", False): "fcfs",
    ("fcfs", True): "highest-bid",
}


def _queue(seed: int):
    """A random queue in arrival order over a fresh cache, and each request's cached length."""
    rng = random.Random(seed)
    source = PromptSource(rng)
    prompts = [source.prompt() for _ in range(rng.choice(SIZES))]
    cache = RadixCache.create_simulated()
    cached = cache_in_arrival_order(cache, prompts, rng)
    reqs = [
        make_req(f"q{seed}r{i}", p, bid=(b := rng.randint(0, 4)), arrival=i + 1.0, priority=b)
        for i, p in enumerate(prompts)
    ]
    return rng, cache, reqs, cached


@dataclass
class Outcome:
    """Queues and requests compared for one policy, and the first mismatch (if any)."""

    queues: int = 0
    requests: int = 0
    mismatch: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def outcomes() -> dict[tuple[str, bool], Outcome]:
    """Every comparison on the same 1,000 queues (building a queue costs more than ordering)."""
    out = {key: Outcome() for key in COMPARED}
    for seed in range(QUEUES):
        rng, cache, reqs, cached = _queue(seed)
        # The cached lengths come from the test's own match (on the scratch tree the cache was
        # built from); no prompt is cached whole, so the cap at all-but-one token changes none.
        waiting = [
            WaitingRequest(r.rid, tokens_of(r), bid_value(r), r.time_stats.wait_queue_entry_time, c)
            for r, c in zip(reqs, cached, strict=True)
        ]
        for (policy, priority), ours in COMPARED.items():
            outcome = out[(policy, priority)]
            queue = list(reqs)
            if priority:
                rng.shuffle(queue)
            SchedulePolicy(policy, cache, False, priority, False).calc_priority(queue)
            got = [r.rid for r in queue]
            expected = clear(waiting, ours).order
            outcome.queues += 1
            outcome.requests += len(queue)
            if got != expected and not outcome.mismatch:
                outcome.mismatch = [f"queue {seed}: sglang {got}", f"mechanism {expected}"]
            if policy != "fcfs":  # cache-aware: SGLang's own match agrees with the test's
                assert [r.prefix_len for r in reqs] == cached, f"queue {seed}: prefix match"
    return out


def test_lpm_matches_sglang(outcomes) -> None:
    outcome = outcomes[("lpm", False)]
    assert not outcome.mismatch, outcome.mismatch
    assert outcome.queues == QUEUES and outcome.requests > 20_000


def test_dfs_weight_matches_sglang(outcomes) -> None:
    outcome = outcomes[("dfs-weight", False)]
    assert not outcome.mismatch, outcome.mismatch
    assert outcome.queues == QUEUES and outcome.requests > 20_000


def test_fcfs_matches_sglang(outcomes) -> None:
    outcome = outcomes[("fcfs", False)]
    assert not outcome.mismatch, outcome.mismatch
    assert outcome.queues == QUEUES


def test_highest_bid_is_sglang_priority_scheduling(outcomes) -> None:
    outcome = outcomes[("fcfs", True)]
    assert not outcome.mismatch, outcome.mismatch
    assert outcome.queues == QUEUES


def test_the_queues_exercise_what_they_compare() -> None:
    """The random queues hold cache hits, in-batch duplicates and dfs-weight reorderings."""
    hits = deprioritized = reordered = 0
    for seed in range(200):
        _, cache, reqs, cached = _queue(seed)
        hits += sum(1 for c in cached if c > 0)
        lpm = list(reqs)
        SchedulePolicy("lpm", cache, False, False, False).calc_priority(lpm)
        # An lpm order that is not sorted by cached length put a duplicate prefix back.
        keys = [r.num_matched_prefix_tokens for r in lpm]
        deprioritized += keys != sorted(keys, reverse=True)
        dfs = list(reqs)
        SchedulePolicy("dfs-weight", cache, False, False, False).calc_priority(dfs)
        reordered += dfs != reqs
    assert hits > 1_000
    assert deprioritized > 10
    assert reordered > 50
