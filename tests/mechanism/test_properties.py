"""Properties of the market: truthfulness, bounded charges, the reserve, contiguous subtrees."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanism import BID_POLICIES, POLICIES, WaitingRequest, clear
from mechanism import reference as ref

from .strategies import BIDS, queues, to_mechanism

AUCTIONS = sorted(BID_POLICIES)


def utility(reqs, rid, value, report, policy, reserve, overhead):
    """-value x completion - payment for request ``rid`` reporting ``report``."""
    rs = ref.with_bid(reqs, rid, report)
    c = clear(
        to_mechanism(rs), policy, reserve=reserve, overhead_tokens=overhead, tokens_per_second=1.0
    )
    return -value * c.completion[rid] - c.payments[rid]


@settings(max_examples=150, deadline=None)
@given(
    queues(max_size=5),
    st.sampled_from(AUCTIONS),
    st.sampled_from([0.0, 0.75, 2.0]),
    st.sampled_from([0, 2]),
    st.data(),
)
def test_no_request_gains_by_misreporting(reqs, policy, reserve, overhead, data):
    r = data.draw(st.sampled_from(reqs))
    truthful = utility(reqs, r.id, r.bid, r.bid, policy, reserve, overhead)
    lies = {
        0.0,
        r.bid / 2,
        r.bid * 2,
        r.bid + 0.3,
        max(0.0, r.bid - 0.3),
        reserve,
        data.draw(BIDS),
        data.draw(st.floats(0, 10)),
    }
    lies |= {o.bid + d for o in reqs for d in (-0.01, 0.0, 0.01) if o.bid + d >= 0}
    for lie in lies:
        assert utility(reqs, r.id, r.bid, lie, policy, reserve, overhead) <= truthful + 1e-9


@settings(max_examples=200, deadline=None)
@given(queues(max_size=7), st.sampled_from(AUCTIONS), st.sampled_from([0.0, 0.75, 2.0]))
def test_charges_between_zero_and_bid_times_time_saved(reqs, policy, reserve):
    c = clear(to_mechanism(reqs), policy, reserve=reserve, tokens_per_second=1.0)
    for r in reqs:
        p = c.payments[r.id]
        saved = c.time_saved(r.id)
        assert p >= 0.0
        assert p <= r.bid * saved + 1e-9
        if r.bid >= reserve:
            # Myerson with a reserve: at least the reserve for every second saved.
            assert p >= reserve * saved - 1e-9


@settings(max_examples=200, deadline=None)
@given(queues(max_size=7), st.sampled_from(POLICIES), st.sampled_from([0.75, 2.0, 5.0]))
def test_bids_under_the_reserve_pay_nothing_and_rank_as_zero(reqs, policy, reserve):
    c = clear(to_mechanism(reqs), policy, reserve=reserve)
    zeroed = [
        ref.Req(r.id, r.tokens, 0.0 if r.bid < reserve else r.bid, r.arrival, r.cached_len)
        for r in reqs
    ]
    assert c.order == clear(to_mechanism(zeroed), policy, reserve=reserve).order
    for r in reqs:
        if r.bid < reserve:
            assert c.payments[r.id] == 0.0


@settings(max_examples=200, deadline=None)
@given(queues(max_size=8, max_len=6), st.sampled_from(POLICIES))
def test_orders_are_permutations_and_dfs_policies_keep_subtrees_contiguous(reqs, policy):
    c = clear(to_mechanism(reqs), policy)
    assert sorted(c.order) == sorted(r.id for r in reqs)
    assert len(set(c.order)) == len(c.order)
    if policy.startswith("dfs-auction"):
        assert ref.is_dfs_order(reqs, c.order, split=policy == "dfs-auction-kv-split")


@settings(max_examples=100, deadline=None)
@given(queues(max_size=8, max_len=6), st.sampled_from(POLICIES))
def test_deterministic_whatever_the_input_order(reqs, policy):
    a = clear(to_mechanism(reqs), policy)
    b = clear(to_mechanism(list(reversed(reqs))), policy)
    assert a.order == b.order
    assert a.payments == pytest.approx(b.payments)


def test_a_higher_bid_never_completes_later():
    """Monotone allocation, on a queue with many crossings."""
    base = [WaitingRequest(f"s{i}", [i % 3, i % 2, i], 0.5 + i / 7, float(i)) for i in range(9)]
    for policy in AUCTIONS:
        previous = None
        for k in range(0, 60):
            bid = k / 10
            reqs = [*base, WaitingRequest("me", [1, 0, 42], bid, 3.5)]
            done = clear(reqs, policy, tokens_per_second=1.0).completion["me"]
            if previous is not None:
                assert done <= previous
            previous = done
