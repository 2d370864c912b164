"""The DFS auctions' state kept in the nodes across rounds, and the tree's ``sharing`` walk.

Each round on a maintained tree, after random arrivals, departures and bid or cached-length
changes, must equal a round on a tree built afresh from the same requests (a from-scratch
plan, with no state to reuse), exactly: order, completions, charges and savings.
"""

import random

import pytest

from mechanism import (
    BID_SCALE,
    DFS_AUCTIONS,
    POLICY,
    RequestTree,
    WaitingRequest,
    clear,
    clear_tree,
)
from mechanism.tree import PLAN_TOKENS

from .test_tree import check_structure, random_request

SETTINGS = [
    (policy, reserve, overhead)
    for policy in sorted(DFS_AUCTIONS)
    for reserve in (0.0, 1.0)
    for overhead in (0, 3)
]


def assert_same_round(tree: RequestTree, live: dict[str, WaitingRequest], setting) -> None:
    policy, reserve, overhead = setting
    got = clear_tree(tree, policy, reserve=reserve, overhead_tokens=overhead)
    want = clear(list(live.values()), policy, reserve=reserve, overhead_tokens=overhead)
    assert got.order == want.order
    # The engine's handles in the same order (the planner patches them with its blocks).
    assert got.handles() == [tree.entries[rid].handle for rid in got.order]
    assert got.completion == want.completion
    assert got.payments == want.payments
    for rid in want.order[:5]:
        assert got.time_saved(rid) == want.time_saved(rid)
        assert got.charge(rid) == want.charge(rid)


def churn(rng: random.Random, tree: RequestTree, live: dict, step: int) -> None:
    action = rng.random()
    fresh = f"{step}-{rng.randrange(10**9)}"
    if live and action < 0.35:
        rid = rng.choice(sorted(live))
        tree.remove(rid)
        del live[rid]
    elif live and action < 0.55:
        rid = rng.choice(sorted(live))
        old = live[rid]
        if rng.random() < 0.5:
            live[rid] = tree.update(rid, bid=rng.choice([0.0, 0.5, 3.0, 9.5]))
        else:
            live[rid] = tree.update(rid, cached_len=rng.randint(0, len(old.tokens)))
    else:
        req = random_request(rng, 0)
        req = WaitingRequest(fresh, req.tokens, req.bid, req.arrival, req.cached_len)
        tree.insert(req, handle=("engine", req.id))
        live[req.id] = req


def grown(seed: int, steps: int) -> tuple[random.Random, RequestTree, dict]:
    """A tree after ``steps`` random changes, with its requests by id and the generator."""
    rng = random.Random(seed)
    tree = RequestTree()
    live: dict[str, WaitingRequest] = {}
    for step in range(steps):
        churn(rng, tree, live, step)
    return rng, tree, live


@pytest.mark.parametrize("seed", range(8))
def test_every_round_on_a_changing_tree_equals_a_fresh_round(seed):
    rng = random.Random(seed)
    tree = RequestTree()
    live: dict[str, WaitingRequest] = {}
    for step in range(250):
        for _ in range(rng.choice([1, 1, 2, 5])):
            churn(rng, tree, live, step)
        # One setting most rounds (as an engine runs), sometimes another in between.
        setting = SETTINGS[0] if rng.random() < 0.7 else rng.choice(SETTINGS)
        assert_same_round(tree, live, setting)
        if step % 25 == 0:
            check_structure(tree)


def test_an_unchanged_tree_reuses_the_round_and_a_change_redoes_only_its_path():
    tree = RequestTree(
        [
            WaitingRequest(f"g{g}-{i}", [g] * 50 + [100 + i, g], 0.5 + i + g, g * 10.0 + i)
            for g in range(4)
            for i in range(5)
        ]
    )
    first = clear_tree(tree, "dfs-auction-density").order
    states = {x: x.memo for x in tree.nodes() if x.memo}
    kept = {x: next(iter(m.values())) for x, m in states.items()}
    built = {x: s.built for x, s in kept.items()}
    assert clear_tree(tree, "dfs-auction-density").order == first
    assert {x: s.built for x, s in kept.items()} == built  # nothing worked out again
    tree.update("g2-3", bid=40.0)
    redone = clear_tree(tree, "dfs-auction-density")
    changed = {x for x, s in kept.items() if s.built != built[x]}
    group = tree.entries["g2-3"].node.parent
    assert changed == {tree.root, group}  # the other groups' blocks were reused
    assert redone.order[:5] == [f"g2-{i}" for i in (3, 4, 2, 1, 0)]


def test_more_settings_than_the_tree_keeps_start_over_and_stay_right():
    rng, tree, live = grown(7, 60)
    # Twelve reserves: more than the tree keeps states for (PLAN_TOKENS).
    for round_ in range(3):
        for k in range(12):
            assert_same_round(tree, live, ("dfs-auction", k * 0.5, 0))
        churn(rng, tree, live, 100 + round_)
    for x in tree.nodes():
        assert x.memo is None or len(x.memo) <= 9


def test_a_round_stays_priced_while_other_settings_clear_the_same_tree():
    _, tree, live = grown(3, 80)
    a = clear_tree(tree, "dfs-auction", reserve=1.0)
    want = dict(a.payments)
    # As many other settings as the nodes keep beside this one (PLAN_TOKENS in all).
    others = [s for s in SETTINGS if s != ("dfs-auction", 1.0, 0)][: PLAN_TOKENS - 1]
    for setting in others:
        clear_tree(tree, setting[0], reserve=setting[1], overhead_tokens=setting[2])
    fresh = clear_tree(tree, "dfs-auction", reserve=1.0)
    a._payments = None  # work them out again from the plan
    assert a.payments == want == fresh.payments


def test_handles_positions_and_the_order_read_lazily():
    tree = RequestTree()
    reqs = [WaitingRequest(f"r{i}", [i % 3, i], float(i % 4), float(i)) for i in range(12)]
    for r in reqs:
        tree.insert(r, handle=("engine", r.id))
    c = clear_tree(tree, "dfs-auction")
    assert c.handles() == [("engine", rid) for rid in c.order]
    assert list(c.iter_order()) == c.order
    pick = [c.order[7], c.order[2]]
    assert c.positions(pick) == {pick[0]: 7, pick[1]: 2}
    with pytest.raises(ValueError, match="nope"):
        c.positions(["nope"])
    # Many at once (one scan of the order rather than a search for each): the same places.
    assert c.positions(reversed(c.order)) == {rid: i for i, rid in enumerate(c.order)}
    with pytest.raises(ValueError, match="nope"):
        c.positions([*c.order, "nope"])
    handles = c.handles()
    tree.remove("r0")
    with pytest.raises(RuntimeError, match="changed"):
        c.handles()
    # The next round refills the same list (an old list is not walked by the garbage
    # collector's young collections; a new one of every request would be, each round).
    again = clear_tree(tree, "dfs-auction")
    assert again.handles() is handles
    assert handles == [("engine", rid) for rid in again.order]
    assert "r0" not in again.order and len(handles) == 11
    # Its order of requests too: a round whose tree changed reads it no more, and keeps its size.
    tree.remove("r1")
    with pytest.raises(RuntimeError, match="changed"):
        again.completion  # noqa: B018 (a property)
    later = clear_tree(tree, "dfs-auction")
    tree.remove("r2")
    with pytest.raises(RuntimeError, match="changed"):
        later.order  # noqa: B018 (a property, made on first use)
    assert (len(again), len(later)) == (11, 10)


def brute_sharing(reqs, tokens, depth):
    tokens = tuple(tokens)
    out = {}
    for r in reqs:
        t = tuple(r.tokens)
        k = 0
        while k < min(len(t), len(tokens)) and t[k] == tokens[k]:
            k += 1
        if k >= depth:
            out[r.id] = k
    return out


@pytest.mark.parametrize("seed", range(6))
def test_sharing_finds_the_requests_with_the_prefix_and_their_common_length(seed):
    rng = random.Random(seed)
    tree = RequestTree()
    reqs = []
    for i in range(120):
        r = random_request(rng, i)
        tree.insert(r)
        reqs.append(r)
    for _ in range(200):
        base = rng.choice(reqs).tokens
        cut = rng.randint(0, len(base))
        tokens = list(base[:cut]) + [rng.randrange(4) for _ in range(rng.randint(0, 20))]
        depth = rng.randint(0, len(tokens))
        got = {e.req.id: k for e, k in tree.sharing(tokens, depth)}
        assert len(got) == len(tree.sharing(tokens, depth))  # each request once
        assert got == brute_sharing(reqs, tokens, depth)
    assert tree.sharing([0, 1], 3) == []  # deeper than the tokens


@pytest.mark.parametrize("seed", range(5))
def test_the_order_book_read_off_a_dfs_plan_equals_the_walked_one(seed):
    from mechanism.book import _dfs_book, _walked_book

    # dfs-auction-kv-split's plan has no block for a fully cached subtree: its book is walked.
    # Some requests hold age credits: the plan's block sums count them, the walk does not; each
    # row's credits are those of the requests under its prefix, summed by brute force.
    read_off = sorted(p for p in DFS_AUCTIONS if not POLICY[p].block_key.split_cached)
    rng, tree, live = grown(seed, 0)
    for step in range(150):
        churn(rng, tree, live, step)
        if step % 30 == 29:
            for rid in rng.sample(sorted(tree.entries), len(tree.entries) // 3):
                tree.set_credit(rid, rng.randrange(0, 3 * BID_SCALE))
            for policy in read_off:
                c = clear_tree(tree, policy, reserve=rng.choice([0.0, 1.0]), overhead_tokens=2)
                for depth, limit in [(1, 64), (2, 32), (3, 8)]:
                    read = _dfs_book(tree, c, depth, limit)
                    assert read == _walked_book(tree, c, depth, limit)
                    for row in read:
                        n = len(row.prefix)
                        under = [
                            e
                            for e in tree.entries.values()
                            if tuple(e.req.tokens[:n]) == row.prefix
                        ]
                        assert row.requests == len(under)
                        assert row.credit_sum == sum(e.credit for e in under) / BID_SCALE


@pytest.mark.parametrize("seed", range(3))
def test_a_tree_of_array_tokens_clears_as_one_of_tuples(seed):
    from array import array

    rng = random.Random(seed)
    reqs = [random_request(rng, i) for i in range(80)]
    as_arrays = [
        WaitingRequest(r.id, array("q", r.tokens), r.bid, r.arrival, r.cached_len) for r in reqs
    ]
    assert type(as_arrays[0].tokens) is array
    tree = RequestTree(as_arrays[:40])
    for r in reqs[40:]:  # tuples into a tree of arrays: converted, compared alike
        tree.insert(r)
    for policy in sorted(DFS_AUCTIONS):
        got = clear_tree(tree, policy, reserve=0.5, overhead_tokens=1)
        want = clear(reqs, policy, reserve=0.5, overhead_tokens=1)
        assert got.order == want.order and got.payments == want.payments
    probe = reqs[3].tokens
    assert sorted((e.req.id, k) for e, k in tree.sharing(probe, 2)) == sorted(
        brute_sharing(reqs, probe, 2).items()
    )
    with pytest.raises(ValueError, match="64-bit"):
        tree.insert(WaitingRequest("huge", (2**70,), 1.0, 0.0))


def _wide_rounds(
    rng: random.Random,
    tokens,
    *,
    start: int,
    rounds: int,
    arrive_p: float,
    remove_p: float,
    bids: list[float],
) -> list[bool]:
    """``start`` requests (``tokens(made, live)`` each), then ``rounds`` rounds of 1-3 changes
    (an arrival, a removal or a new bid, by the odds given), each round equal to a fresh one.
    Returns, for each of the planner's patches (``dfs_auction._patch``), whether it patched a
    node of requests only, before and after (not the root), and its orders of requests and
    handles with its blocks."""
    import mechanism.dfs_auction as dfs_auction

    tree = RequestTree()
    live: dict[str, WaitingRequest] = {}
    made = 0

    def arrive():
        nonlocal made
        made += 1
        req = WaitingRequest(
            f"w{made}", tokens(made, live), rng.choice([0.0, 0.5, 1.0, 4.0]), float(made),
            cached_len=rng.choice([0, 0, 30]),
        )  # fmt: skip
        tree.insert(req, handle=("engine", req.id))
        live[req.id] = req

    for _ in range(start):
        arrive()
    patches: list[bool] = []
    real_patch = dfs_auction._patch

    def recorded(x, xs, *args):
        singles = len(xs.flat) == len(xs.inside)
        patched = real_patch(x, xs, *args)
        patches.append(patched and singles and len(xs.inside) == x.size and x.parent is not None)
        return patched

    dfs_auction._patch = recorded
    try:
        for _ in range(rounds):
            for _ in range(rng.randint(1, 3)):
                what = rng.random()
                if what < arrive_p:
                    arrive()
                elif what < arrive_p + remove_p:
                    rid = rng.choice(sorted(live))
                    tree.remove(rid)
                    del live[rid]
                else:
                    rid = rng.choice(sorted(live))
                    live[rid] = tree.update(rid, bid=rng.choice(bids))
            assert_same_round(tree, live, rng.choice(SETTINGS[:4]))
    finally:
        dfs_auction._patch = real_patch
    return patches


@pytest.mark.parametrize("seed", range(3))
def test_wide_nodes_patched_in_place_equal_a_fresh_round(seed):
    # A few system prompts with many requests each: most rounds change a few of a node's
    # children, which the planner patches into the node's sorted blocks instead of re-sorting.
    rng = random.Random(seed)
    systems = [[s] * 30 for s in range(4)]

    def tokens(made, live):
        return rng.choice(systems) + [rng.randrange(50) for _ in range(rng.randint(1, 4))]

    patches = _wide_rounds(
        rng, tokens, start=200, rounds=120, arrive_p=0.4, remove_p=0.3, bids=[0.0, 2.0, 9.0]
    )
    assert len(patches) > 100


@pytest.mark.parametrize("seed", range(3))
def test_wide_nodes_of_requests_only_patch_their_order_alike(seed):
    # A few system prompts, each under many requests that branch off it at once (one leaf
    # each): most rounds change a few bids (as the wait bound's credit steps do) and the
    # planner patches the node's order of requests by the same moves as its blocks. Now and
    # then a request extends another's prompt (its leaf becomes a node, and back when one of
    # the two leaves), or two of a node's requests change at once.
    rng = random.Random(seed)
    systems = [[s] * 30 for s in range(8)]

    def tokens(made, live):
        if made > 160 and rng.random() < 0.1:  # under another request's prompt, once started
            return [*rng.choice(sorted(live.values(), key=lambda r: r.id)).tokens, 7]
        return [*rng.choice(systems), 100 + made, rng.randrange(50)]

    patches = _wide_rounds(
        rng, tokens, start=160, rounds=150, arrive_p=0.15, remove_p=0.15,
        bids=[0.0, 0.25, 2.0, 9.0],
    )  # fmt: skip
    assert sum(patches) > 100


@pytest.mark.parametrize("policy", sorted(DFS_AUCTIONS))
def test_a_request_that_leaves_and_comes_back_between_rounds_is_planned_once(policy):
    # SGLang puts a retracted request back in its waiting queue with the same id: between two
    # rounds its leaf goes and a new leaf for it comes. The new block equals the old one in
    # every field but the request's entry, and the node still holds the old block while it
    # patches in the new one (a patch: a few of many children changed). The 100k-waiting plugin
    # benchmark met this (TypeError comparing two entries; the round ran in queue order).
    system = (7,) * 20
    reqs = [
        WaitingRequest(f"r{i}", system + (i,), 0.5 + (i % 3), float(i), cached_len=20)
        for i in range(12)
    ]
    tree = RequestTree(reqs)
    clear_tree(tree, policy, reserve=0.0, overhead_tokens=1)
    for req in (reqs[3], reqs[8]):  # two of twelve: patched, not re-sorted
        tree.remove(req.id)
        tree.insert(req)
    got = clear_tree(tree, policy, reserve=0.0, overhead_tokens=1)
    want = clear_tree(RequestTree(reqs), policy, reserve=0.0, overhead_tokens=1)
    assert got.order == want.order and len(set(got.order)) == len(reqs)
    assert got.payments == want.payments
