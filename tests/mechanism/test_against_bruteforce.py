"""The mechanism against its brute-force reference, ``mechanism.reference``."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanism import POLICIES, clear
from mechanism import reference as ref

from .strategies import queues, to_mechanism

DFS_POLICIES = (
    "dfs-weight",
    "dfs-auction",
    "dfs-auction-density",
    "dfs-auction-kv",
    "dfs-auction-kv-split",
)
DFS_AUCTIONS = ("dfs-auction", "dfs-auction-density", "dfs-auction-kv", "dfs-auction-kv-split")
REFERENCED = ("fcfs", "highest-bid", *DFS_AUCTIONS)
PRICED = ("highest-bid", *DFS_AUCTIONS)
RESERVES = st.sampled_from([0.0, 0.0, 0.75, 2.0])
OVERHEADS = st.sampled_from([0, 0, 1, 3])


@settings(max_examples=300, deadline=None)
@given(queues(), RESERVES, OVERHEADS, st.sampled_from([1.0, 250.0]))
def test_orders_completions_welfare(reqs, reserve, overhead, tps):
    for policy in POLICIES:
        c = clear(
            to_mechanism(reqs),
            policy,
            reserve=reserve,
            overhead_tokens=overhead,
            tokens_per_second=tps,
        )
        assert sorted(c.order) == sorted(r.id for r in reqs), "order must be a permutation"
        expected = ref.completions(reqs, c.order, overhead, tps)
        assert c.completion == pytest.approx(expected)
        assert c.planned_welfare == pytest.approx(ref.welfare(reqs, expected, reserve))
        if policy in REFERENCED:
            assert c.order == ref.reference_order(reqs, policy, reserve, overhead), policy
        if policy in DFS_AUCTIONS:
            split = policy == "dfs-auction-kv-split"
            assert ref.is_dfs_order(reqs, c.order, split=split), policy


@settings(max_examples=200, deadline=None)
@given(queues(max_size=5, max_len=4), RESERVES, OVERHEADS)
def test_density_is_the_best_dfs_order(reqs, reserve, overhead):
    c = clear(
        to_mechanism(reqs),
        "dfs-auction-density",
        reserve=reserve,
        overhead_tokens=overhead,
        tokens_per_second=1.0,
    )
    best = max(
        ref.welfare(reqs, ref.completions(reqs, order, overhead, 1.0), reserve)
        for order in ref.all_dfs_orders(reqs)
    )
    assert c.planned_welfare == pytest.approx(best)


@settings(max_examples=60, deadline=None)
@given(
    queues(max_size=5, max_len=4),
    RESERVES,
    OVERHEADS,
    st.sampled_from(PRICED),
)
def test_payments_match_the_myerson_integral(reqs, reserve, overhead, policy):
    c = clear(
        to_mechanism(reqs), policy, reserve=reserve, overhead_tokens=overhead, tokens_per_second=1.0
    )
    for r in reqs:
        low, high, saved = ref.myerson_bounds(reqs, r.id, policy, reserve, overhead, 1.0, steps=200)
        assert low - 1e-9 <= c.payments[r.id] <= high + 1e-9, (r.id, low, high)
        assert c.time_saved(r.id) == pytest.approx(saved)


@settings(max_examples=150, deadline=None)
@given(queues(max_size=6), OVERHEADS)
def test_density_payment_is_the_vcg_charge(reqs, overhead):
    c = clear(
        to_mechanism(reqs), "dfs-auction-density", overhead_tokens=overhead, tokens_per_second=1.0
    )
    for r in reqs:
        assert c.payments[r.id] == pytest.approx(ref.vcg_payment(reqs, r.id, 0.0, overhead, 1.0))


def test_payments_on_random_real_valued_bids():
    """Bids with no structure (lognormal), more requests, fine grid."""
    import random

    rng = random.Random(7)
    for _ in range(25):
        reqs = [
            ref.Req(
                f"r{i}",
                tuple(rng.choice((0, 1, 2)) for _ in range(rng.randint(1, 6))),
                rng.lognormvariate(0, 1),
                rng.random(),
                0,
            )
            for i in range(rng.randint(2, 8))
        ]
        for policy in PRICED:
            reserve = rng.choice([0.0, 0.8])
            c = clear(to_mechanism(reqs), policy, reserve=reserve, tokens_per_second=1.0)
            for r in reqs:
                low, high, _ = ref.myerson_bounds(reqs, r.id, policy, reserve, 0, 1.0, steps=1000)
                assert low - 1e-9 <= c.payments[r.id] <= high + 1e-9


@settings(max_examples=150, deadline=None)
@given(
    queues(max_size=8, max_len=6),
    RESERVES,
    OVERHEADS,
    st.sampled_from(PRICED),
)
def test_one_charge_at_a_time_equals_all_at_once(reqs, reserve, overhead, policy):
    """The engine's path (a charge per admitted request) and the batch agree."""
    one = clear(to_mechanism(reqs), policy, reserve=reserve, overhead_tokens=overhead)
    singles = {r.id: one.charge(r.id) for r in reqs}
    batch = clear(to_mechanism(reqs), policy, reserve=reserve, overhead_tokens=overhead)
    assert singles == pytest.approx(batch.payments, rel=1e-12, abs=1e-15)


@settings(max_examples=200, deadline=None)
@given(
    queues(max_size=7), RESERVES, OVERHEADS, st.sampled_from(PRICED), st.sampled_from([1.0, 250.0])
)
def test_charges_are_the_reference_crossing_point_charges(reqs, reserve, overhead, policy, tps):
    """Both of the fast paths (every charge at once, one charge at a time) and the reference's
    crossing-point charge, on the same queue."""
    kwargs = {"reserve": reserve, "overhead_tokens": overhead, "tokens_per_second": tps}
    batch = clear(to_mechanism(reqs), policy, **kwargs)
    one = clear(to_mechanism(reqs), policy, **kwargs)
    for r in reqs:
        charge, saved = ref.crossing_charge(reqs, r.id, policy, reserve, overhead, tps)
        assert batch.payments[r.id] == pytest.approx(charge, rel=1e-9, abs=1e-12), r.id
        assert one.charge(r.id) == pytest.approx(charge, rel=1e-9, abs=1e-12), r.id
        assert one.time_saved(r.id) == pytest.approx(saved, rel=1e-9, abs=1e-12), r.id


def test_crossing_point_charges_on_random_real_valued_bids():
    """Lognormal bids (ties improbable), cached prefixes, up to ten requests."""
    import random

    rng = random.Random(11)
    for _ in range(150):
        reqs = []
        for i in range(rng.randint(2, 10)):
            tokens = tuple(rng.choice((0, 1, 2)) for _ in range(rng.randint(1, 6)))
            bid = rng.lognormvariate(0, 1) if rng.random() < 0.8 else 0.0
            reqs.append(ref.Req(f"r{i}", tokens, bid, rng.random(), rng.randint(0, len(tokens))))
        policy = rng.choice(PRICED)
        reserve = rng.choice([0.0, 0.8])
        overhead = rng.choice([0, 2])
        c = clear(to_mechanism(reqs), policy, reserve=reserve, overhead_tokens=overhead)
        tps = c.tokens_per_second
        for r in reqs:
            charge, saved = ref.crossing_charge(reqs, r.id, policy, reserve, overhead, tps)
            # Bids are whole ticks (1e-9 $/s) in the mechanism: the charges differ by as much.
            assert c.payments[r.id] == pytest.approx(charge, rel=1e-6, abs=1e-9), (policy, r.id)
            assert c.time_saved(r.id) == pytest.approx(saved), (policy, r.id)


@settings(max_examples=40, deadline=None)
@given(queues(max_size=5, max_len=4), RESERVES, OVERHEADS, st.sampled_from(PRICED))
def test_the_crossing_point_charge_is_the_myerson_payment(reqs, reserve, overhead, policy):
    """The reference's two statements of the charge agree: the sum over crossing points and the
    integral of docs/mechanism.md, "Payments" (re-clearing on a grid of bids)."""
    for r in reqs:
        charge, saved = ref.crossing_charge(reqs, r.id, policy, reserve, overhead, 1.0)
        low, high, t_b = ref.myerson_bounds(reqs, r.id, policy, reserve, overhead, 1.0, steps=200)
        assert low - 1e-9 <= charge <= high + 1e-9, (r.id, low, charge, high)
        assert saved == pytest.approx(t_b)
