"""Bounded waiting (mechanism.aging): the age credit in the DFS auctions' order, the charges that
keep it apart from the bids, against the brute-force reference, and the incremental rounds."""

from __future__ import annotations

import gc
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanism import DFS_AUCTIONS, RequestTree, WaitingRequest, clear_tree, to_ticks
from mechanism import reference as ref
from mechanism.aging import AgeClock, AgeCredit, WaitBound, wait_bound_checked

from .strategies import queues, to_mechanism

AUCTIONS = sorted(DFS_AUCTIONS)
# Credits on the bids' grid of quarters: sums are exact, ties agree with the reference.
CREDITS = st.sampled_from([0.0, 0.0, 0.25, 0.5, 1.0, 2.0])
RESERVES = st.sampled_from([0.0, 0.0, 0.75, 2.0])
OVERHEADS = st.sampled_from([0, 0, 1, 3])


def credited(reqs: list[ref.Req], credits: list[float]) -> list[ref.Req]:
    return [replace(r, credit=c) for r, c in zip(reqs, credits, strict=False)]


def tree_of(reqs: list[ref.Req]) -> RequestTree:
    """The mechanism's tree of the reference queue, each request given its credit in ticks."""
    tree = RequestTree(to_mechanism(reqs))
    for r in reqs:
        tree.set_credit(r.id, to_ticks(r.credit))
    return tree


def test_a_hand_worked_credit_lowers_the_charge_not_the_order_rule() -> None:
    # A: 10 tokens, bids $3/s, credit $4/s; B: 2 tokens, bids $1/s; no sharing, no overhead,
    # 1 token/s. B's key is 1/2 = 0.5. A's key at bid z is (4 + z) / 10: A goes first at its
    # bid (0.7 > 0.5) and passes B from z = 0.5 x 10 - 4 = 1 on, so it pays B's 2 s x $1/s =
    # $2. B passes nobody and pays nothing. Without the credit A's crossing is at 5 > 3: it
    # stays behind B and pays nothing, and B, whose key at bid 0 would be 0 < 0.3, passes A's
    # 10 s at the critical bid 0.3 x 2 = $0.6/s: $6.
    a = ref.Req("a", tuple(range(10, 20)), 3.0, 0.0, credit=4.0)
    b = ref.Req("b", (1, 2), 1.0, 1.0)
    c = clear_tree(tree_of([a, b]), "dfs-auction-density", tokens_per_second=1.0)
    assert c.order == ["a", "b"]
    assert c.payments == {"a": pytest.approx(2.0), "b": 0.0}
    assert c.time_saved("a") == pytest.approx(2.0)
    plain = clear_tree(tree_of([replace(a, credit=0.0), b]), "dfs-auction-density",
                       tokens_per_second=1.0)  # fmt: skip
    assert plain.order == ["b", "a"] and plain.payments == {"a": 0.0, "b": pytest.approx(6.0)}
    # With a credit of $6/s A is ahead at bid 0 already: its bid buys nothing, it pays nothing.
    ahead = clear_tree(tree_of([replace(a, credit=6.0), b]), "dfs-auction-density",
                       tokens_per_second=1.0)  # fmt: skip
    assert ahead.order == ["a", "b"] and ahead.payments["a"] == 0.0


@settings(max_examples=200, deadline=None)
@given(
    queues(max_size=7),
    st.lists(CREDITS, min_size=7, max_size=7),
    RESERVES,
    OVERHEADS,
    st.sampled_from(AUCTIONS),
    st.sampled_from([1.0, 250.0]),
)
def test_orders_and_charges_with_credits_are_the_references(
    reqs, credits, reserve, overhead, policy, tps
):
    reqs = credited(reqs, credits)
    kwargs = {"reserve": reserve, "overhead_tokens": overhead, "tokens_per_second": tps}
    batch = clear_tree(tree_of(reqs), policy, **kwargs)
    one = clear_tree(tree_of(reqs), policy, **kwargs)
    assert batch.order == ref.reference_order(reqs, policy, reserve, overhead)
    for r in reqs:
        charge, saved = ref.crossing_charge(reqs, r.id, policy, reserve, overhead, tps)
        assert batch.payments[r.id] == pytest.approx(charge, rel=1e-9, abs=1e-12), r.id
        assert one.charge(r.id) == pytest.approx(charge, rel=1e-9, abs=1e-12), r.id
        assert one.time_saved(r.id) == pytest.approx(saved, rel=1e-9, abs=1e-12), r.id


@settings(max_examples=40, deadline=None)
@given(
    queues(max_size=5, max_len=4),
    st.lists(CREDITS, min_size=5, max_size=5),
    RESERVES,
    OVERHEADS,
    st.sampled_from(AUCTIONS),
)
def test_the_charge_with_credits_is_the_myerson_payment(reqs, credits, reserve, overhead, policy):
    """The crossing sum is the integral of docs/mechanism.md, "Payments", with the credits held
    fixed (re-clearing the reference on a grid of the own bid), and the fast charge lies within
    it."""
    reqs = credited(reqs, credits)
    c = clear_tree(tree_of(reqs), policy, reserve=reserve, overhead_tokens=overhead,
                   tokens_per_second=1.0)  # fmt: skip
    for r in reqs:
        low, high, t_b = ref.myerson_bounds(reqs, r.id, policy, reserve, overhead, 1.0, steps=200)
        assert low - 1e-9 <= c.payments[r.id] <= high + 1e-9, (r.id, low, high)
        assert c.time_saved(r.id) == pytest.approx(t_b)


@settings(max_examples=100, deadline=None)
@given(
    queues(max_size=7),
    st.lists(CREDITS, min_size=7, max_size=7),
    st.sampled_from(AUCTIONS),
    st.data(),
)
def test_the_order_is_monotone_in_the_own_bid(reqs, credits, policy, data):
    """Raising one request's bid, every credit kept, never makes it complete later."""
    reqs = credited(reqs, credits)
    rid = data.draw(st.sampled_from([r.id for r in reqs]))
    grid = [0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 9.0, 20.0]
    done = []
    for bid in grid:
        c = clear_tree(tree_of(ref.with_bid(reqs, rid, bid)), policy, tokens_per_second=1.0)
        done.append(c.completion[rid])
    assert done == sorted(done, reverse=True)


def test_credit_levels_and_ticks_follow_the_reference() -> None:
    rule = AgeCredit(wait_s=8.0, density=0.5, steps=4)
    r = ref.Req("r", tuple(range(12)), 1.0, 3.0)
    for now in (0.0, 3.0, 4.99, 5.0, 7.0, 9.0, 11.0, 11.5, 40.0):
        level = rule.level(3.0, now)
        # 12 tokens x $0.5/s per token x level / 4 steps, in ticks
        assert rule.credit_ticks(level, 12) == to_ticks(ref.age_credit(r, now, 8.0, 0.5, 4))
    assert [rule.level(3.0, t) for t in (4.99, 5.0, 7.0, 9.0, 11.0, 99.0)] == [0, 1, 2, 3, 4, 4]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"wait_s": 0.0, "density": 1.0}, "wait_s"),
        ({"wait_s": float("inf"), "density": 1.0}, "wait_s"),
        ({"wait_s": 5.0, "density": 0.0}, "density"),
        ({"wait_s": 5.0, "density": "1"}, "density"),
        ({"wait_s": 5.0, "density": 1.0, "steps": 0}, "steps"),
    ],
)
def test_bad_knobs_are_refused(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        AgeCredit(**kwargs)


def test_set_credit_refuses_bad_input_and_unknown_requests() -> None:
    tree = RequestTree([WaitingRequest("a", (1, 2), 1.0, 0.0)])
    with pytest.raises(ValueError, match="not waiting"):
        tree.set_credit("zz", 5)
    with pytest.raises(ValueError, match="credit"):
        tree.set_credit("a", -1)
    with pytest.raises(ValueError, match="credit"):
        tree.set_credit("a", 2.5)  # type: ignore[arg-type]
    assert tree.entries["a"].credit == 0


@pytest.mark.parametrize("policy", AUCTIONS)
def test_rounds_with_a_clock_equal_rounds_built_afresh(policy) -> None:
    """A maintained tree whose credits an AgeClock moves on round by round, with arrivals and
    departures, plans exactly as a tree built afresh with the reference's credits; and the
    clock touches the tree only when a request crosses a step. Some requests join the clock
    after later arrivals (a request put back in the queue keeps its arrival): the clock's
    per-level queues are in arrival order, and these must still step on time."""
    rng = random.Random(f"aging:{policy}")
    rule = AgeCredit(wait_s=4.0, density=0.25, steps=4)  # credits exact in binary
    tree = RequestTree()
    clock = AgeClock(rule)
    live: dict[str, ref.Req] = {}
    now = 0.0
    for step in range(160):
        now += rng.choice([0.0, 0.1, 0.5, 1.3])
        if live and rng.random() < 0.3:
            rid = rng.choice(sorted(live))
            tree.remove(rid)
            del live[rid]
        else:
            arrival = max(0.0, now - rng.choice([0.0, 0.0, 0.0, 0.7, 2.6]))
            r = ref.Req(f"q{step}", tuple(rng.choice((0, 1, 2)) for _ in range(rng.randint(1, 6))),
                        rng.choice([0.0, 0.5, 1.0, 3.0]), arrival, rng.randint(0, 1))  # fmt: skip
            tree.insert(WaitingRequest(r.id, r.tokens, r.bid, r.arrival, r.cached_len))
            clock.admit(r.id, r.arrival)
            live[r.id] = r
        before = tree.version
        crossed = clock.advance(tree, now)
        assert (tree.version > before) == (crossed > 0)  # one change of the tree, if any
        want_credits = {
            rid: ref.age_credit(r, now, rule.wait_s, rule.density, rule.steps)
            for rid, r in live.items()
        }
        assert {rid: tree.entries[rid].credit for rid in live} == {
            rid: to_ticks(c) for rid, c in want_credits.items()
        }
        assert clock.advance(tree, now) == 0  # nothing more to do in the same round
        fresh = tree_of([replace(r, credit=want_credits[r.id]) for r in live.values()])
        for reserve in (0.0, 1.0):
            got = clear_tree(tree, policy, reserve=reserve, overhead_tokens=1)
            want = clear_tree(fresh, policy, reserve=reserve, overhead_tokens=1)
            assert got.order == want.order
            assert got.payments == want.payments
    # What it keeps per request is numbers, in dicts the garbage collector never walks: a
    # scheduler's collections would otherwise walk one item per waiting request.
    assert not [name for name, v in vars(clock).items() if isinstance(v, dict) and gc.is_tracked(v)]


OWNERS = st.lists(st.sampled_from(["x", "y", ""]), min_size=6, max_size=6)


def tenant_tree(reqs: list[ref.Req], owners: dict[str, str]) -> RequestTree:
    tree = RequestTree(
        [WaitingRequest(r.id, r.tokens, r.bid, r.arrival, r.cached_len, owner=owners[r.id])
         for r in reqs]
    )  # fmt: skip
    for r in reqs:
        tree.set_credit(r.id, to_ticks(r.credit))
    return tree


@settings(max_examples=150, deadline=None)
@given(queues(max_size=6), st.lists(CREDITS, min_size=6, max_size=6), OWNERS, OVERHEADS)
def test_tenant_charges_with_credits_are_the_vcg_ones(reqs, credits, owners, overhead):
    """dfs-auction-density, no reserve: the tenant-level charge is the delay on the other
    tenants' requests valued at their bids plus credits, less the own credit x time saved."""
    reqs = credited(reqs, credits)
    by_id = {r.id: o for r, o in zip(reqs, owners, strict=False)}
    c = clear_tree(tenant_tree(reqs, by_id), "dfs-auction-density", overhead_tokens=overhead,
                   tokens_per_second=1.0, charge_scope="tenant")  # fmt: skip
    for r in reqs:
        want = ref.tenant_payment(reqs, r.id, by_id, "dfs-auction-density", 0.0, overhead, 1.0)
        assert c.payments[r.id] == pytest.approx(want, abs=1e-9), r.id
        assert c.charge(r.id) == pytest.approx(want, abs=1e-9), r.id


@settings(max_examples=40, deadline=None)
@given(
    queues(max_size=5, max_len=4),
    st.lists(CREDITS, min_size=5, max_size=5),
    OWNERS,
    st.sampled_from([0.0, 0.75, 2.0]),
    st.sampled_from(["dfs-auction", "dfs-auction-density"]),
)
def test_tenant_charges_with_credits_take_off_the_own_tenants_delay(
    reqs, credits, owners, reserve, policy
):
    reqs = credited(reqs, credits)
    by_id = {r.id: o for r, o in zip(reqs, owners, strict=False)}
    c = clear_tree(tenant_tree(reqs, by_id), policy, reserve=reserve, tokens_per_second=1.0,
                   charge_scope="tenant")  # fmt: skip
    for r in reqs:
        low, high, _ = ref.myerson_bounds(reqs, r.id, policy, reserve, 0, 1.0, steps=400)
        want = ref.tenant_payment(reqs, r.id, by_id, policy, reserve, 0, 1.0)
        assert c.payments[r.id] == pytest.approx(want, abs=(high - low) / 2 + 1e-9), r.id


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 8, 3600.0])
def test_the_operators_bound_is_off_or_in_range(value) -> None:
    assert wait_bound_checked(value) == float(value)


@pytest.mark.parametrize("value", [0.49, -1, 3600.01, float("nan"), float("inf"), "8", True, None])
def test_a_bound_out_of_range_is_refused_saying_the_range(value) -> None:
    with pytest.raises(ValueError, match=r"0 \(off\) or 0.5..3600 seconds"):
        wait_bound_checked(value)


def test_the_engines_wait_bound_follows_a_change_of_rule_from_the_next_round() -> None:
    # a (12 tokens, in at 0 s) and b (4 tokens, in at 5 s); $0.5/s per token at the bound.
    tree = RequestTree([WaitingRequest("a", tuple(range(12)), 1.0, 0.0),
                        WaitingRequest("b", (50, 51, 52, 53), 1.0, 5.0)])  # fmt: skip
    bound = WaitBound()
    assert bound.advance(tree, 6.0, None) == 0  # off: nothing moves
    # On at 6 s with 8 s in 4 steps (2 s each): a has waited 6 s, level 3, at once: 12 x 0.5 x
    # 3/4 = $4.5/s; b has waited 1 s, level 0.
    assert bound.advance(tree, 6.0, AgeCredit(wait_s=8.0, density=0.5, steps=4)) == 1
    assert tree.entries["a"].credit == to_ticks(4.5) and tree.entries["b"].credit == 0
    # A new rule (4 s in 2 steps): a's credit is worked out again from its arrival (level 2 of
    # 2: $6/s), b's too (1 s: level 0).
    assert bound.advance(tree, 6.0, AgeCredit(wait_s=4.0, density=0.5, steps=2)) == 2
    assert tree.entries["a"].credit == to_ticks(6.0) and tree.entries["b"].credit == 0
    bound.admit("c", 6.5)
    tree.insert(WaitingRequest("c", (70, 71), 1.0, 6.5))
    assert bound.advance(tree, 8.5, bound.credit) == 2  # b (3.5 s: level 1), c (2 s: level 1)
    assert tree.entries["b"].credit == to_ticks(1.0) and tree.entries["c"].credit == to_ticks(0.5)
    # Off: every credit is taken back.
    assert bound.advance(tree, 9.0, None) == 3
    assert [e.credit for e in tree.entries.values()] == [0, 0, 0]


@settings(max_examples=40, deadline=None)
@given(
    st.randoms(use_true_random=False),
    st.sampled_from(AUCTIONS),
    st.sampled_from([0.0, 1.0]),
    st.sampled_from([1, 2, 4]),
)
def test_rounds_on_wide_groups_with_credit_steps_equal_rounds_from_scratch(
    rng, policy, reserve, steps
) -> None:
    """Wide groups (a few shared prefixes, many requests each, half of them cached), the clock
    moving every round so that a few requests of each group cross a step (patched into the
    group's sorted blocks, the way the plugin's rounds go) while requests arrive and leave:
    every round on the maintained tree plans and charges exactly as a tree built from scratch
    with the same credits (RequestTree.set_credit one by one)."""
    rule = AgeCredit(wait_s=2.0, density=0.25, steps=steps)  # credits exact in binary
    systems = [tuple([s] * 12) for s in range(3)]
    tree = RequestTree()
    clock = AgeClock(rule)
    live: dict[str, WaitingRequest] = {}
    now = 0.0
    made = 0
    for _ in range(25):
        now += rng.choice([0.1, 0.25, 0.5])
        for _ in range(rng.randint(1, 8)):
            made += 1
            g = rng.randrange(len(systems))
            req = WaitingRequest(
                f"w{made}", systems[g] + tuple(rng.randrange(40) for _ in range(rng.randint(1, 3))),
                rng.choice([0.0, 0.5, 1.0, 4.0]), now, 12 if g != 1 else rng.choice([0, 6]),
            )  # fmt: skip
            if req.tokens in {r.tokens for r in live.values()}:
                continue
            tree.insert(req)
            clock.admit(req.id, req.arrival)
            live[req.id] = req
        for rid in rng.sample(sorted(live), min(len(live), rng.randint(0, 3))):
            tree.remove(rid)
            del live[rid]
        clock.advance(tree, now)
        fresh = RequestTree(list(live.values()))
        for rid, r in live.items():
            level = rule.level(r.arrival, now)
            assert tree.entries[rid].credit == rule.credit_ticks(level, len(r.tokens))
            fresh.set_credit(rid, tree.entries[rid].credit)
        got = clear_tree(tree, policy, reserve=reserve, overhead_tokens=1)
        want = clear_tree(fresh, policy, reserve=reserve, overhead_tokens=1)
        assert got.order == want.order
        assert got.payments == want.payments
