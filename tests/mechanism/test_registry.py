"""The policy registry and the welfare definitions: one place says what each policy is."""

import random

import pytest

from mechanism import (
    BID_POLICIES,
    DEFAULT_POLICY,
    DFS_AUCTIONS,
    OFFERED,
    POLICIES,
    POLICY,
    WaitingRequest,
    block_key,
    clear,
    planned_welfare,
    policy_checked,
    policy_offered,
    realized_welfare,
)
from mechanism import reference as ref
from mechanism.policies import AVERAGE_BID, BID_DENSITY, CACHE_KEPT, CACHE_SPLIT, REGISTRY


def test_the_registry_names_the_policies_of_the_design_in_order() -> None:
    assert POLICIES == (
        "fcfs",
        "lpm",
        "dfs-weight",
        "highest-bid",
        "dfs-auction",
        "dfs-auction-density",
        "dfs-auction-kv",
        "dfs-auction-kv-split",
    )
    assert [p.name for p in REGISTRY] == list(POLICIES)
    assert all(POLICY[p.name] is p and str(p) == p.name for p in REGISTRY)


def test_the_sets_the_engines_use_are_read_off_the_registry() -> None:
    kv = {"dfs-auction-kv", "dfs-auction-kv-split"}
    assert BID_POLICIES == {"highest-bid", "dfs-auction", "dfs-auction-density", *kv}
    assert DFS_AUCTIONS == {"dfs-auction", "dfs-auction-density", *kv}
    for p in REGISTRY:
        # A policy charges for priority exactly when its order uses bids.
        assert (p.charges is not None) == p.uses_bids, p.name
        assert (p.block_key is not None) == (p.name in DFS_AUCTIONS), p.name
    assert POLICY["dfs-auction"].block_key is AVERAGE_BID
    assert POLICY["dfs-auction-density"].block_key is BID_DENSITY
    assert POLICY["dfs-auction-kv"].block_key is CACHE_KEPT
    assert POLICY["dfs-auction-kv-split"].block_key is CACHE_SPLIT
    assert CACHE_SPLIT.split_cached and not CACHE_KEPT.split_cached
    # The reference states the boost on its own; the two must say the same.
    assert CACHE_KEPT.cached_boost == CACHE_SPLIT.cached_boost == ref.KV_CACHED_BOOST == 4.0


def test_operators_are_offered_the_measured_choices_and_the_default_is_one() -> None:
    # The goal table (docs/benchmarks.md) decides: kv-split the default, density for its
    # cheaper rounds, lpm for a market without an auction; the rest are benchmark baselines.
    assert OFFERED == ("lpm", "dfs-auction-density", "dfs-auction-kv-split")
    assert DEFAULT_POLICY == "dfs-auction-kv-split" and DEFAULT_POLICY in OFFERED
    assert policy_offered("lpm") == "lpm"
    for baseline in ("fcfs", "dfs-weight", "highest-bid", "dfs-auction", "dfs-auction-kv"):
        with pytest.raises(ValueError, match=f"{baseline!r} is a baseline of the benchmarks"):
            policy_offered(baseline)
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        policy_offered("nope")


def test_block_keys() -> None:
    assert block_key("dfs-auction", 6.0, 3, 100) == 2.0
    assert block_key("dfs-auction-density", 6.0, 3, 100) == 0.06
    assert block_key("dfs-auction-density", 6.0, 3, 0) == float("inf")
    assert block_key("dfs-auction-kv", 6.0, 3, 100) == 0.06  # an uncached edge: density
    assert block_key("dfs-auction-kv", 6.0, 3, 100, cached=True) == 0.24  # 6 / (100 / 4)
    with pytest.raises(ValueError, match="does not order blocks"):
        block_key("fcfs", 6.0, 3, 100)


KEYS = [AVERAGE_BID, BID_DENSITY, CACHE_KEPT, CACHE_SPLIT]


@pytest.mark.parametrize("key", KEYS, ids=lambda k: k.name)
def test_the_key_is_the_bid_sum_over_the_size(key) -> None:
    # One rule (plan.BlockKey): the planner's nk, the readers' key and the charges' size agree,
    # and a block of size zero, costing the others nothing, has an infinite key.
    rng = random.Random(5)
    for _ in range(300):
        bsum = rng.choice([0, 1, rng.randrange(10**15)])
        n, work, cached = (
            rng.randint(0, 4),
            rng.choice([0, rng.randint(1, 5_000)]),
            rng.random() < 0.5,
        )
        size = key.size(n, work, cached)
        assert size == (work if key.per_work else n) / (key.cached_boost if cached else 1)
        expected = bsum / size if size > 0 else float("inf")
        assert key(bsum, n, work, cached) == expected
        assert key.nk(bsum, n, work, cached) == -expected
    assert key(6.0, 0, 0) == key(0.0, 0, 0, cached=True) == float("inf")


@pytest.mark.parametrize("policy", sorted(DFS_AUCTIONS))
def test_a_block_of_size_zero_goes_first(policy) -> None:
    from mechanism import RequestTree
    from mechanism.plan import NK

    # The root of an empty tree: no requests, no work.
    tree = RequestTree()
    rules = POLICY[policy]
    assert rules.planner(tree, rules, 0, 0).blocks[tree.root][NK] == float("-inf")
    assert clear([], policy).order == []
    # z's tokens are all cached and there is no overhead: its block needs no work, so by bid
    # density it goes first at any bid (a zero one included); by average bid it is an ordinary
    # block of one request with bid 0.
    reqs = [ref.Req("a", (1, 2, 3), 5.0, 0.0), ref.Req("z", (7, 8), 0.0, 1.0, cached_len=2)]
    c = clear(
        [WaitingRequest(r.id, r.tokens, r.bid, r.arrival, r.cached_len) for r in reqs], policy
    )
    assert c.order == (["a", "z"] if policy == "dfs-auction" else ["z", "a"])
    assert c.order == ref.reference_order(reqs, policy, 0.0, 0)
    assert c.payments == {"a": 0.0, "z": 0.0}


@pytest.mark.parametrize("bad", ["FCFS", "", "dfs_auction", None, 3, ["fcfs"]])
def test_policy_checked_refuses_what_is_not_a_policy_name(bad) -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        policy_checked(bad)
    with pytest.raises(ValueError, match="unknown policy"):
        clear([], bad)


def test_the_two_welfares() -> None:
    assert planned_welfare([(2.0, 3.0), (0.0, 9.0), (1.0, 0.5)]) == -6.5
    assert realized_welfare([(2.0, 0.25), (4.0, 1.0)]) == -4.5
    assert planned_welfare([]) == 0 and realized_welfare([]) == 0


def test_a_clearings_welfare_is_its_planned_welfare() -> None:
    reqs = [
        WaitingRequest("a", [1, 2, 3], 2.0, 0.0),
        WaitingRequest("b", [1, 2, 4], 0.5, 1.0),
        WaitingRequest("c", [5, 6], 4.0, 2.0),
    ]
    for policy in POLICIES:
        c = clear(reqs, policy, reserve=1.0, tokens_per_second=1.0)
        effective = {r.id: (r.bid if r.bid >= 1.0 else 0.0) for r in reqs}
        expected = planned_welfare((effective[rid], t) for rid, t in c.completion.items())
        assert c.planned_welfare == pytest.approx(expected)


@pytest.mark.parametrize("policy", sorted(DFS_AUCTIONS))
@pytest.mark.parametrize("overhead", [0, 2])
def test_the_planners_order_blocks_by_the_registrys_block_key(policy, overhead) -> None:
    from mechanism import RequestTree, to_ticks
    from mechanism.bench import make_queue
    from mechanism.payments import request_block
    from mechanism.tree import Node

    tree = RequestTree(make_queue(200, 8, seed=3))
    rules = POLICY[policy]
    plan = rules.planner(tree, rules, to_ticks(0.05), overhead)
    key = rules.block_key
    # Every request is a block somewhere, found again by its key; every block is keyed right.
    found = [request_block(plan, e, reserve=to_ticks(0.05)) for e in tree.entries.values()]
    assert len(set(found)) == len(tree)
    shared = [x for x in tree.nodes() if x is tree.root or x.size > 1]

    def fully_cached(x: Node) -> bool:
        return x is not tree.root and x.size > 1 and x.cached >= x.end

    def counts_cached(inner) -> bool:
        # A request's block has an edge only as the one request of a leaf. dfs-auction-kv-split
        # also boosts every block right under a fully cached node: the block of a child of it,
        # or of a request ending at it.
        node = inner if type(inner) is Node else inner.node
        has_edge = type(inner) is Node or node.size == 1
        if has_edge and node is not tree.root and node.cached > node.start:
            return True
        at = node.parent if has_edge else node
        return key.split_cached and at is not None and fully_cached(at)

    for x in shared:
        blocks = plan.inside[x]
        assert blocks == sorted(blocks, key=lambda b: (b[0], b[1]))
        for nk, _tie, n, bsum, work, inner in [*blocks, plan.blocks[x]]:
            assert -nk == pytest.approx(key(bsum, n, work, counts_cached(inner)), rel=1e-12)
        assert plan.blocks[x][2] == x.size
