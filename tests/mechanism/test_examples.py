"""Hand-worked examples, one per policy, with the arithmetic in the comments.

The queue (tokens_per_second = 1, so completions are in tokens; overhead 0):

    A = [1 2 3 4 5 6]  bid 1  arrival 0  cached 2
    B = [1 2 3 7 8]    bid 4  arrival 1  cached 2
    C = [9 9 9 9]      bid 2  arrival 2  cached 0
    D = [1 2 10]       bid 0  arrival 3  cached 2

Its tree: root -> X=[1 2] (cached, 0 work) -> { Y=[3] (1) -> { A:[4 5 6] (3), B:[7 8] (2) },
D:[10] (1) };  root -> C:[9 9 9 9] (4).  Block works: Y-block 1+3+2 = 6, X-block 7, C 4.
"""

import pytest

from mechanism import POLICIES, RequestTree, WaitingRequest, clear, clear_tree


def queue():
    return [
        WaitingRequest("A", [1, 2, 3, 4, 5, 6], 1.0, 0.0, cached_len=2),
        WaitingRequest("B", [1, 2, 3, 7, 8], 4.0, 1.0, cached_len=2),
        WaitingRequest("C", [9, 9, 9, 9], 2.0, 2.0, cached_len=0),
        WaitingRequest("D", [1, 2, 10], 0.0, 3.0, cached_len=2),
    ]


def run(policy, **kw):
    return clear(queue(), policy, tokens_per_second=1.0, **kw)


def test_fcfs():
    # A: Y1 + A3 = 4; B: +2 = 6; C: +4 = 10; D: +1 = 11.
    c = run("fcfs")
    assert c.order == ["A", "B", "C", "D"]
    assert c.completion == {"A": 4, "B": 6, "C": 10, "D": 11}
    assert c.planned_welfare == pytest.approx(-(1 * 4 + 4 * 6 + 2 * 10))
    assert c.payments == {"A": 0, "B": 0, "C": 0, "D": 0}


def test_lpm():
    # Cached lengths A2 B2 D2 C0: A, B, D (ties by arrival), then C.
    c = run("lpm")
    assert c.order == ["A", "B", "D", "C"]
    assert c.completion == {"A": 4, "B": 6, "D": 7, "C": 11}
    assert c.payments == {"A": 0, "B": 0, "C": 0, "D": 0}


def test_highest_bid():
    # B 4, C 2, A 1, D 0.  B: Y1+B2 = 3; C: +4 = 7; A: +3 = 10; D: +1 = 11.
    # B at bid 0 would go C, A, B (10); past A's bid 1: C, B, A (C4 + Y1 + B2 = 7); past C's 2: 3.
    #   T = 0 on (0,1), 3 on (1,2), 7 on (2,4]:  p_B = 4*7 - (3*1 + 7*2) = 11.
    # C at bid 0 would go B, A, C (10); past A's bid 1 it completes at 7: p_C = 2*3 - 3*1 = 3.
    # A at bid 0 keeps its place (A arrived before D): pays 0.
    c = run("highest-bid")
    assert c.order == ["B", "C", "A", "D"]
    assert c.completion == {"B": 3, "C": 7, "A": 10, "D": 11}
    assert c.payments == pytest.approx({"B": 11, "C": 3, "A": 0, "D": 0})
    assert c.time_saved("B") == pytest.approx(7)
    assert c.planned_welfare == pytest.approx(-(4 * 3 + 2 * 7 + 1 * 10))


def test_dfs_auction():
    # Root: X-block average (1+4+0)/3 = 5/3 < C's 2, so C first.  At X: Y-block 2.5 > D 0.
    # At Y: B 4 > A 1.  Order C, B, A, D: C 4; B Y1+B2 = 7; A +3 = 10; D +1 = 11.
    # B passes A at Y at critical bid 1 (A's key 1 x 1 request - 0 others), delay 3: p_B = 3.
    #   (At 0, B's X-block key 1/3 stays behind C: nothing else changes.)
    # C passes the X-block at critical bid 5/3 (key 5/3 x 1 - 0), delay 7: p_C = 35/3.
    c = run("dfs-auction")
    assert c.order == ["C", "B", "A", "D"]
    assert c.completion == {"C": 4, "B": 7, "A": 10, "D": 11}
    assert c.payments == pytest.approx({"C": 35 / 3, "B": 3, "A": 0, "D": 0})
    assert c.planned_welfare == pytest.approx(-(2 * 4 + 4 * 7 + 1 * 10))


def test_dfs_auction_density():
    # Root: X-block 5/7 > C 2/4.  At X: Y-block 5/6 > D 0/1.  At Y: B 4/2 > A 1/3.
    # Order B, A, D, C: B 3, A 6, D 7, C 11.
    # B passes A at Y (critical (1/3) x 2 - 0 = 2/3, delay 3: 2) and, at the root, C
    #   (its X-block at bid 0 has key 1/7 < 1/2; critical 0.5 x 7 - 1 = 2.5, delay 4: 10).
    #   p_B = 12 = the others' loss: with B at 0 the order is C, A, B, D (C 4, A 8), with B at 4
    #   C waits 11 and A 6: (2*11 + 1*6) - (2*4 + 1*8) = 12.
    c = run("dfs-auction-density")
    assert c.order == ["B", "A", "D", "C"]
    assert c.completion == {"B": 3, "A": 6, "D": 7, "C": 11}
    assert c.payments == pytest.approx({"B": 12, "A": 0, "C": 0, "D": 0})
    assert c.time_saved("B") == pytest.approx(7)
    assert c.planned_welfare == pytest.approx(-(4 * 3 + 1 * 6 + 2 * 11))


def test_dfs_auction_density_with_reserve():
    # Reserve 1.5: A's bid 1 counts as 0.  Root: X 4/7 > C 0.5; Y 4/6 > D 0; B 2 > A 0.
    # Same order.  B passes A at critical 0 -> pays the reserve: 1.5 x 3 = 4.5; and C at
    # critical 0.5 x 7 - 0 = 3.5: 3.5 x 4 = 14.  p_B = 18.5
    #   (= 4*7 - integral_{1.5}^{4} T, T = 3 on [1.5, 3.5), 7 above: 28 - 6 - 3.5).
    c = run("dfs-auction-density", reserve=1.5)
    assert c.order == ["B", "A", "D", "C"]
    assert c.payments == pytest.approx({"B": 18.5, "A": 0, "C": 0, "D": 0})
    assert c.planned_welfare == pytest.approx(-(4 * 3 + 2 * 11))


def test_dfs_weight_groups_cached_prefixes_only():
    # Q = [1 2 4 9] cached 2, R = [5 6 7 8] cached 3, P1 = [1 2 3 7], P2 = [1 2 3 8] cached 3.
    # Cached-prefix tree: [1 2] holds P1, P2 (below it, at [1 2 3]) and Q (at [1 2]): weight 3;
    # [5 6 7] holds R: weight 1.  Heavier subtree first, and at a point its child subtrees
    # before the requests that end there: P1, P2, Q, R.  lpm instead: R, P1, P2 (cached 3, by
    # arrival), then Q.
    reqs = [
        WaitingRequest("Q", [1, 2, 4, 9], 0.0, 0.0, cached_len=2),
        WaitingRequest("R", [5, 6, 7, 8], 0.0, 1.0, cached_len=3),
        WaitingRequest("P1", [1, 2, 3, 7], 0.0, 2.0, cached_len=3),
        WaitingRequest("P2", [1, 2, 3, 8], 0.0, 3.0, cached_len=3),
    ]
    assert clear(reqs, "dfs-weight").order == ["P1", "P2", "Q", "R"]
    assert clear(reqs, "lpm").order == ["R", "P1", "P2", "Q"]


@pytest.mark.parametrize("policy", POLICIES)
def test_empty_queue(policy):
    c = clear([], policy)
    assert c.order == [] and c.payments == {} and c.planned_welfare == 0.0


def test_lpm_defers_a_second_request_sharing_an_uncached_prefix():
    # SGLang's in-batch check: X and Y share 40 uncached tokens (>= 32), so Y, checked after X
    # (arrival order), goes behind everything; Z shares only 2 tokens with X and keeps its place.
    # W is cached 33 (> 32): not checked.  Sorted: W (33 cached), X, Z (0 cached), then Y.
    shared = list(range(100, 140))
    reqs = [
        WaitingRequest("X", [*shared, 1], 0.0, 0.0),
        WaitingRequest("Y", [*shared, 2], 0.0, 1.0),
        WaitingRequest("Z", [100, 101, 7, 7], 0.0, 2.0),
        WaitingRequest("W", [*range(200, 240)], 0.0, 3.0, cached_len=33),
    ]
    assert clear(reqs, "lpm").order == ["W", "X", "Z", "Y"]


def test_the_order_book_and_a_requests_block():
    # The example queue under dfs-auction-density: the root's children are X = [1 2] (A, B, D:
    # bids 1 + 4 + 0 = 5 $/s over 7 uncached tokens) and C's leaf (2 $/s over 4 tokens).
    # X goes first (5/7 > 2/4).  Below X: Y = [3] (A, B: 5 $/s over 6 tokens) then D's leaf.
    from mechanism.book import block_of, subtree_book

    tree = RequestTree(queue())
    c = clear_tree(tree, "dfs-auction-density", tokens_per_second=1.0)
    rows = {tuple(r.prefix): r for r in subtree_book(tree, c, max_depth=2)}
    assert len(rows) == 4  # X and C's leaf; below X, Y and D's leaf
    x = rows[(1, 2)]
    assert (x.requests, x.bid_sum, x.work, x.rank, x.first_position) == (3, 5.0, 7, 0, 0)
    assert x.density == pytest.approx(5 / 7) and x.cached_tokens == 2
    leaf_c = rows[(9, 9, 9, 9)]
    assert (leaf_c.requests, leaf_c.rank, leaf_c.first_position) == (1, 1, 3)
    y = rows[(1, 2, 3)]
    assert (y.depth, y.requests, y.bid_sum, y.work, y.rank) == (2, 2, 5.0, 6, 0)
    assert rows[(1, 2, 10)].rank == 1
    b = block_of(tree, c, "B")
    assert (b.prefix_tokens, b.requests) == (2, 3)
    assert b.bid_mean == pytest.approx(5 / 3) and b.density == pytest.approx(5 / 7)
