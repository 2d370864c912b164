"""The maintained request tree: structure, and rounds equal to clearing from scratch."""

import random

import pytest

from mechanism import POLICIES, RequestTree, WaitingRequest, clear, clear_tree
from mechanism.requests import to_ticks


def check_structure(tree: RequestTree) -> None:
    """Compressed trie invariants, checked from the definition."""
    count = 0
    for node in tree.nodes():
        count += len(node.reqs)
        if node is not tree.root:
            assert node.start < node.end
            assert node.parent.children[node.seq[node.start]] is node
            assert node.parent.end == node.start
            # Compressed: a node without requests branches.
            assert node.reqs or len(node.children) >= 2
        for entry in node.reqs.values():
            assert entry.node is node
            assert len(entry.req.tokens) == node.end
            assert tuple(entry.req.tokens[: node.end]) == tuple(node.seq[: node.end])
        for child in node.children.values():
            # Every token of the child's edge is on every request below it.
            stack = [child]
            while stack:
                n = stack.pop()
                for e in n.reqs.values():
                    assert tuple(e.req.tokens[: child.end]) == tuple(child.seq[: child.end])
                stack.extend(n.children.values())
        # The maintained cached depth is the deepest cached_len below, from the definition.
        below, stack = [], [node]
        while stack:
            n = stack.pop()
            below.extend(e.req.cached_len for e in n.reqs.values())
            stack.extend(n.children.values())
        deepest = max(below, default=0)
        assert node.size == len(below)
        assert node.cached == deepest
        assert node.ew == max(0, node.end - max(node.start, deepest))
    assert count == len(tree)
    # The array of bids the order book reads holds each waiting request's bid once.
    assert sorted(tree.bid_ticks()) == sorted(to_ticks(r.bid) for r in tree)


def random_request(rng: random.Random, i: int) -> WaitingRequest:
    # Shared "system prompts" of varied length, then a short private suffix.
    system = [rng.randrange(3)] * rng.choice([0, 3, 40]) + [rng.randrange(2)] * rng.randint(0, 3)
    toks = system + [rng.randrange(4) for _ in range(rng.randint(1, 30))]
    return WaitingRequest(
        f"q{i}",
        toks,
        rng.choice([0.0, 0.5, 1.0, 2.5, 7.0]),
        rng.random() * 100,
        cached_len=rng.randint(0, len(toks)),
    )


@pytest.mark.parametrize("seed", range(6))
def test_incremental_tree_matches_a_fresh_clearing(seed):
    rng = random.Random(seed)
    tree = RequestTree()
    live: dict[str, WaitingRequest] = {}
    for step in range(300):
        action = rng.random()
        if live and action < 0.35:
            rid = rng.choice(sorted(live))
            assert tree.remove(rid) is live.pop(rid)
        elif live and action < 0.5:
            rid = rng.choice(sorted(live))
            old = live[rid]
            live[rid] = tree.update(
                rid, bid=rng.choice([0.0, 3.0, 9.5]), cached_len=rng.randint(0, len(old.tokens))
            )
        else:
            req = random_request(rng, step)
            tree.insert(req)
            live[req.id] = req
        if step % 5 == 0:
            check_structure(tree)
            for policy in POLICIES:
                reserve = rng.choice([0.0, 1.0])
                got = clear_tree(tree, policy, reserve=reserve, overhead_tokens=2)
                want = clear(list(live.values()), policy, reserve=reserve, overhead_tokens=2)
                assert got.order == want.order
                assert got.completion == pytest.approx(want.completion)
                assert got.payments == pytest.approx(want.payments)
    for rid in list(live):
        tree.remove(rid)
    assert len(tree) == 0 and not tree.root.children


def test_insert_and_remove_split_and_merge_edges():
    tree = RequestTree()
    tree.insert(WaitingRequest("a", [1, 2, 3, 4], 0, 0))
    assert [(n.start, n.end) for n in tree.path("a")] == [(0, 0), (0, 4)]
    tree.insert(WaitingRequest("b", [1, 2, 9], 0, 1))  # splits a's edge after [1 2]
    assert [(n.start, n.end) for n in tree.path("a")] == [(0, 0), (0, 2), (2, 4)]
    tree.insert(WaitingRequest("c", [1, 2], 0, 2))  # ends at the split point
    assert tree.path("c")[-1] is tree.path("a")[1]
    tree.remove("c")
    tree.remove("b")  # [1 2] no longer branches: merged back into one edge
    assert [(n.start, n.end) for n in tree.path("a")] == [(0, 0), (0, 4)]
    check_structure(tree)


def test_a_stale_clearing_refuses_to_price():
    tree = RequestTree([WaitingRequest("a", [1], 1.0, 0), WaitingRequest("b", [2], 2.0, 1)])
    c = clear_tree(tree, "dfs-auction")
    tree.remove("b")
    with pytest.raises(RuntimeError, match="changed"):
        c.charge("a")


def test_long_shared_prefixes_are_compared_in_slices():
    system = list(range(5000))
    tree = RequestTree()
    for i in range(50):
        tree.insert(WaitingRequest(f"r{i}", system + [i, i + 1], 1.0, i))
    check_structure(tree)
    # The system prompt is one edge under the root, each request a leaf below it.
    (shared,) = tree.root.children.values()
    assert (shared.start, shared.end, len(shared.children)) == (0, 5000, 50)


def test_a_cached_length_update_keeps_every_other_field_and_is_checked():
    from dataclasses import fields

    req = WaitingRequest("a", [1, 2, 3], 0.5, 4.0, cached_len=1, owner="acme")
    new = req.with_cached_len(2)
    assert new == WaitingRequest("a", [1, 2, 3], 0.5, 4.0, cached_len=2, owner="acme")
    assert [f.name for f in fields(WaitingRequest)] == [
        "id",
        "tokens",
        "bid",
        "arrival",
        "cached_len",
        "owner",
    ]  # with_cached_len copies exactly these
    for bad in (4, -1, True, 1.5):
        with pytest.raises(ValueError, match="cached_len"):
            req.with_cached_len(bad)
    tree = RequestTree([req])
    with pytest.raises(ValueError, match="cached_len"):
        tree.update("a", cached_len=9)
    assert tree.get("a") is req
