"""dfs-auction-kv: bid density where a subtree whose edge is cached counts a quarter of its work;
dfs-auction-kv-split: the same with fully cached subtrees split into their blocks.

Hand-worked cases first, then the mechanism's properties on random queues with cache state
against the brute-force reference (mechanism.reference): the order, monotone completions
in each request's own bid, and the Myerson charges, for both.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanism import WaitingRequest, clear
from mechanism import reference as ref

from .strategies import queues, to_mechanism

KV = "dfs-auction-kv"
SPLIT = "dfs-auction-kv-split"


def _two_groups(b_bid: float) -> list[WaitingRequest]:
    # a: 4 of its 5 tokens cached (work 1); b: nothing cached (work 5). No overheads, 1 token/s.
    return [
        WaitingRequest("a", (1, 1, 1, 1, 5), 1.0, 0.0, cached_len=4),
        WaitingRequest("b", (2, 2, 2, 2, 2), b_bid, 1.0),
    ]


def test_a_cached_subtree_keeps_its_place_against_a_denser_uncached_one() -> None:
    # Densities: a 1/1 = 1, b 8/5 = 1.6, so dfs-auction-density serves b first. dfs-auction-kv
    # counts a's work as 1/4 (its edge is cached): a's key is 4 > 1.6, so a goes first.
    density = clear(_two_groups(8.0), "dfs-auction-density", tokens_per_second=1.0)
    assert density.order == ["b", "a"]
    kv = clear(_two_groups(8.0), KV, tokens_per_second=1.0)
    assert kv.order == ["a", "b"]
    assert kv.completion == {"a": 1.0, "b": 6.0}
    # a passes b at the bid z where 4z = 1.6, z = 0.4: it pays 0.4 $/s for b's 5 s of work.
    assert kv.payments["a"] == pytest.approx(2.0)
    assert kv.time_saved("a") == pytest.approx(5.0)
    assert kv.payments["b"] == 0.0
    # Under density b pays the VCG charge: a's 5 s of extra waiting at 1 $/s.
    assert density.payments["b"] == pytest.approx(5.0)


def test_outbidding_a_cached_subtree_costs_the_boosted_critical_bid() -> None:
    # b at 25 $/s: key 5 > 4, so b goes first, saving a's 1 s of work. Its critical bid is where
    # z / 5 = 4, z = 20: it pays 20 $ (against density's VCG 5 $ at this bid, a's 5 s x 1 $/s).
    kv = clear(_two_groups(25.0), KV, tokens_per_second=1.0)
    assert kv.order == ["b", "a"]
    assert kv.payments["b"] == pytest.approx(20.0)
    assert kv.time_saved("b") == pytest.approx(1.0)
    assert kv.payments["a"] == 0.0
    density = clear(_two_groups(25.0), "dfs-auction-density", tokens_per_second=1.0)
    assert density.payments["b"] == pytest.approx(5.0)


def test_a_request_ending_at_a_shared_node_is_not_boosted() -> None:
    # x ends where y and z branch off a cached prefix; it has no edge of its own, so it is keyed
    # by plain density (bid / overhead), beside y's and z's leaves whose edges are uncached.
    reqs = [
        WaitingRequest("x", (7, 7), 1.0, 0.0, cached_len=2),
        WaitingRequest("y", (7, 7, 1), 3.0, 1.0, cached_len=2),
        WaitingRequest("z", (7, 7, 2), 1.5, 2.0, cached_len=2),
    ]
    c = clear(reqs, KV, overhead_tokens=1, tokens_per_second=1.0)
    # keys: x 1/1, y 3/2, z 1.5/2: y, x, z (as density: no sibling here has a cached edge).
    assert c.order == ["y", "x", "z"]
    assert c.order == clear(reqs, "dfs-auction-density", overhead_tokens=1).order


def _cached_group(a2_bid: float, cached: int = 4) -> list[WaitingRequest]:
    # a1, a2 share the 4-token prefix S, cached up to ``cached``, and add 1 token each (work 1);
    # b is 5 uncached tokens (work 5) bidding 4. No overheads, 1 token/s.
    s = (1, 1, 1, 1)
    return [
        WaitingRequest("a1", (*s, 5), 8.0, 0.0, cached_len=cached),
        WaitingRequest("a2", (*s, 6), a2_bid, 1.0, cached_len=cached),
        WaitingRequest("b", (2, 2, 2, 2, 2), 4.0, 2.0),
    ]


def test_split_serves_a_cached_groups_blocks_among_the_others() -> None:
    reqs = _cached_group(0.125)
    # kv: S's subtree is one block, boosted: 8.125 / (2 / 4) = 16.25 > b's 4 / 5 = 0.8.
    kv = clear(reqs, KV, tokens_per_second=1.0)
    assert kv.order == ["a1", "a2", "b"]
    # split: S is fully cached, so its blocks go among the root's, each boosted: a1 8 / (1 / 4)
    # = 32, b 0.8, a2 0.125 / (1 / 4) = 0.5.
    split = clear(reqs, SPLIT, tokens_per_second=1.0)
    assert split.order == ["a1", "b", "a2"]
    assert split.completion == {"a1": 1.0, "b": 6.0, "a2": 7.0}
    # a1 at bid 0 would be last (key 0): it passes b where 4z = 0.8 (z = 0.2, 5 s) and a2
    # where 4z = 0.5 (z = 0.125, 1 s): 1.0 + 0.125.
    assert split.payments["a1"] == pytest.approx(1.125)
    assert split.time_saved("a1") == pytest.approx(6.0)
    # b passes a2 where z / 5 = 0.5, z = 2.5, for a2's 1 s.
    assert split.payments["b"] == pytest.approx(2.5)
    assert split.payments["a2"] == 0.0
    # kv: a1 passes a2 inside S's block (z = 0.125, 1 s), and with S's block passes b where
    # (0.125 + z) / 0.5 = 0.8, z = 0.275, for 5 s: 0.125 + 1.375. b cannot pass the block.
    assert kv.payments["a1"] == pytest.approx(1.5)
    assert kv.payments["b"] == 0.0
    for c in (kv, split):
        for r in reqs:
            low, high, _ = ref.myerson_bounds(
                [ref.Req(q.id, q.tokens, q.bid, q.arrival, q.cached_len) for q in reqs],
                r.id,
                c.policy,
                0.0,
                0,
                1.0,
                steps=800,
            )
            assert low - 1e-9 <= c.payments[r.id] <= high + 1e-9


def test_a_partly_cached_subtree_is_not_split() -> None:
    # S cached up to 3 of its 4 tokens: keeping a1 and a2 together still saves S's 4th token,
    # so the subtree stays one block (boosted, its edge partly cached): 8.125 / (3 / 4) > 0.8.
    reqs = _cached_group(0.125, cached=3)
    assert clear(reqs, SPLIT).order == clear(reqs, KV).order == ["a1", "a2", "b"]


@settings(max_examples=200, deadline=None)
@given(
    queues(max_size=7),
    st.sampled_from([0.0, 0.75]),
    st.sampled_from([0, 1, 3]),
    st.sampled_from([KV, SPLIT]),
)
def test_without_cache_state_it_is_the_density_auction(reqs, reserve, overhead, policy):
    cold = [ref.Req(r.id, r.tokens, r.bid, r.arrival, 0) for r in reqs]
    kv = clear(to_mechanism(cold), policy, reserve=reserve, overhead_tokens=overhead)
    density = clear(
        to_mechanism(cold), "dfs-auction-density", reserve=reserve, overhead_tokens=overhead
    )
    assert kv.order == density.order
    assert kv.payments == pytest.approx(density.payments)


@pytest.mark.parametrize("policy", [KV, SPLIT])
@settings(max_examples=150, deadline=None)
@given(queues(max_size=6), st.sampled_from([0.0, 0.75, 2.0]), st.sampled_from([0, 2]), st.data())
def test_completion_falls_as_its_own_bid_rises(policy, reqs, reserve, overhead, data):
    """Monotone allocation, by re-clearing the reference auction at rising bids."""
    r = data.draw(st.sampled_from(reqs))
    bids = sorted({0.0, reserve, r.bid, *(o.bid for o in reqs), *(o.bid + 0.01 for o in reqs)})
    comps = []
    for z in bids:
        rs = ref.with_bid(reqs, r.id, z)
        order = ref.reference_order(rs, policy, reserve, overhead)
        comps.append(ref.completions(rs, order, overhead, 1.0)[r.id])
        c = clear(to_mechanism(rs), policy, reserve=reserve, overhead_tokens=overhead)
        assert c.order == order
    assert all(a >= b for a, b in zip(comps, comps[1:], strict=False)), (bids, comps)


@pytest.mark.parametrize("policy", [KV, SPLIT])
@settings(max_examples=120, deadline=None)
@given(queues(max_size=5, max_len=4), st.sampled_from([0.0, 0.75, 2.0]), st.sampled_from([0, 1]))
def test_charges_are_the_myerson_payments_with_cache_state(policy, reqs, reserve, overhead):
    c = clear(
        to_mechanism(reqs), policy, reserve=reserve, overhead_tokens=overhead, tokens_per_second=1.0
    )
    singles = clear(to_mechanism(reqs), policy, reserve=reserve, overhead_tokens=overhead)
    for r in reqs:
        low, high, saved = ref.myerson_bounds(reqs, r.id, policy, reserve, overhead, 1.0, steps=200)
        assert low - 1e-9 <= c.payments[r.id] <= high + 1e-9, (r.id, low, high)
        assert c.time_saved(r.id) == pytest.approx(saved)
        # The engine's path (one request's charge at a time) agrees with the batch.
        assert singles.charge(r.id) == pytest.approx(
            clear(to_mechanism(reqs), policy, reserve=reserve, overhead_tokens=overhead).payments[
                r.id
            ],
            rel=1e-12,
            abs=1e-15,
        )
