"""Rounds cleared on one tree keep their own scratch: each clearing answers as if it were alone.

A clearing works part of its answers out lazily (the planned work of bid-blind orders, the
charges), long after its planner ran; a second round on the same tree must not change them.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanism import POLICIES, RequestTree, WaitingRequest, clear, clear_tree
from mechanism import reference as ref

from .strategies import queues, to_mechanism
from .test_examples import queue

REFERENCED = ("fcfs", "highest-bid", "dfs-auction", "dfs-auction-density")


def test_a_later_round_leaves_an_earlier_clearing_as_it_was():
    # The example queue of test_examples, tokens_per_second = 1. fcfs's completions are worked
    # out on demand and dfs-auction's charges from its blocks; both are asked for only after
    # dfs-auction-density (other blocks, other keys, the same nodes) and lpm have been cleared.
    tree = RequestTree(queue())
    fcfs = clear_tree(tree, "fcfs", tokens_per_second=1.0)
    average = clear_tree(tree, "dfs-auction", tokens_per_second=1.0)
    density = clear_tree(tree, "dfs-auction-density", tokens_per_second=1.0)
    lpm = clear_tree(tree, "lpm", tokens_per_second=1.0)
    assert fcfs.completion == {"A": 4, "B": 6, "C": 10, "D": 11}
    assert lpm.completion == {"A": 4, "B": 6, "D": 7, "C": 11}
    assert average.charge("C") == pytest.approx(35 / 3) and average.charge("B") == pytest.approx(3)
    assert average.payments == pytest.approx({"C": 35 / 3, "B": 3, "A": 0, "D": 0})
    assert density.payments == pytest.approx({"B": 12, "A": 0, "C": 0, "D": 0})
    assert density.time_saved("B") == pytest.approx(7)
    assert average.order == ["C", "B", "A", "D"] and density.order == ["B", "A", "D", "C"]


def test_a_change_to_the_tree_still_expires_every_clearing():
    tree = RequestTree(queue())
    clearings = [clear_tree(tree, p) for p in POLICIES]
    tree.remove("D")
    for c in clearings:
        with pytest.raises(RuntimeError, match="changed"):
            c.charge("A")
        with pytest.raises(RuntimeError, match="changed"):
            _ = c.payments
        if c.policy in ("fcfs", "lpm"):  # their planned work is worked out on demand
            with pytest.raises(RuntimeError, match="changed"):
                c.completion_at(len(c) - 1)


def test_a_round_in_the_middle_of_a_prefill_batch_leaves_the_batch_alone():
    # The engines build a prefill batch from a round's order; lpm's own in-batch check must not
    # reuse the batch's stamps. X and Y share 40 uncached tokens, Z shares nothing.
    shared = list(range(100, 140))
    tree = RequestTree(
        [
            WaitingRequest("X", [*shared, 1], 0.0, 0.0),
            WaitingRequest("Y", [*shared, 2], 0.0, 1.0),
            WaitingRequest("Z", [7, 7], 0.0, 2.0),
        ]
    )
    batch = tree.begin_batch()
    tree.batch_add("X", batch)
    assert clear_tree(tree, "lpm").order == ["X", "Z", "Y"]
    assert tree.batch_recomputed("Y", batch) == 40
    assert tree.batch_recomputed("Z", batch) <= 0


@settings(max_examples=150, deadline=None)
@given(
    queues(max_size=6),
    st.lists(
        st.tuples(
            st.sampled_from(POLICIES), st.sampled_from([0.0, 0.75, 2.0]), st.sampled_from([0, 2])
        ),
        min_size=2,
        max_size=6,
    ),
    st.randoms(use_true_random=False),
)
def test_every_clearing_of_one_tree_answers_as_if_alone(reqs, rounds, rng):
    tree = RequestTree(to_mechanism(reqs))
    clearings = [
        (clear_tree(tree, p, reserve=r, overhead_tokens=o, tokens_per_second=1.0), p, r, o)
        for p, r, o in rounds
    ]
    # Ask in a shuffled order, single charges before the whole payments, so that every lazy
    # answer is worked out after every round was cleared.
    rng.shuffle(clearings)
    for c, policy, reserve, overhead in clearings:
        alone = clear(
            to_mechanism(reqs),
            policy,
            reserve=reserve,
            overhead_tokens=overhead,
            tokens_per_second=1.0,
        )
        first = reqs[0].id
        assert c.charge(first) == pytest.approx(alone.charge(first))
        assert c.time_saved(first) == pytest.approx(alone.time_saved(first))
        assert c.order == alone.order
        assert c.completion == pytest.approx(ref.completions(reqs, c.order, overhead, 1.0))
        assert c.payments == pytest.approx(alone.payments)
        if policy in REFERENCED:
            assert c.order == ref.reference_order(reqs, policy, reserve, overhead)
