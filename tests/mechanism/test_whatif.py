"""The reserve what-if on a queue small enough to work by hand.

Three requests, no shared prefix, no overhead, 1 token/s (so a completion in seconds is the
tokens served up to it), dfs-auction-density (blocks by bid / work), the round admitting the
first place:

    a: 2 tokens, bid 3 $/s, arrives at 0     density 1.5
    b: 1 token,  bid 1 $/s, arrives at 1     density 1
    c: 3 tokens, bid 2 $/s, arrives at 2     density 0.667

Ties (effective bid 0) go to the earliest arrival. Welfare counts every bid as sent.

- reserve 0: order a b c, completions 2 3 6, welfare -(3x2 + 1x3 + 2x6) = -21, 3 keep priority.
  a's charge: T(z) = 6 - C_a(z): a goes behind c below z = 4/3, behind b below z = 2, so
  T = 0 | 3 | 4 on [0, 4/3) [4/3, 2) [2, 3]: 3x4 - (3x2/3 + 4x1) = 6. (b's, at place 1:
  behind c below z = 2/3, T = 3 above: 1x3 - 3x(1/3) = 2; the delay it puts on c, 1 s x 2.)
- reserve 1.5: b counts 0: order a c b, completions 2 5 6, welfare -(6 + 10 + 6) = -22, 2 keep
  priority. Below the reserve a ties with b at 0 and goes first (earlier) but behind c:
  C_a = 5; from 1.5 up, first: T = 3; charge 3x3 - 3x(3 - 1.5) = 4.5.
- reserve 2.5: only a keeps priority: order a b c (b, c tied at 0, by arrival), welfare -21.
  Below the reserve a ties with both and arrives first: first anyway, T = 0, charge 0.
- reserve 3.5: nobody keeps priority, order by arrival a b c, welfare -21, charge 0.
"""

from __future__ import annotations

import pytest

from mechanism import RequestTree, WaitingRequest
from mechanism.whatif import (
    queue_reclear,
    queue_snapshot,
    queue_snapshot_checked,
    queue_tree,
    reserve_grid,
)

QUEUE = {
    "parent": [-1, -1, -1],
    "edge": [2, 1, 3],
    "node": [0, 1, 2],
    "id": ["a", "b", "c"],
    "bid": [3.0, 1.0, 2.0],
    "arrival": [0.0, 1.0, 2.0],
    "cached": [0, 0, 0],
    "overhead_tokens": 0,
    "charge_scope": "request",
}


def reclear(reserves, admitted=(0,)):
    return queue_reclear(
        queue_snapshot_checked(QUEUE),
        policy="dfs-auction-density",
        tokens_per_second=1.0,
        admitted=list(admitted),
        reserves=reserves,
    )


@pytest.mark.parametrize(
    ("reserve", "first", "revenue", "welfare", "priority"),
    [(0.0, "a", 6.0, -21.0, 3), (1.5, "a", 4.5, -22.0, 2), (2.5, "a", 0.0, -21.0, 1),
     (3.5, "a", 0.0, -21.0, 0)],
)  # fmt: skip
def test_revenue_welfare_and_priority_at_a_reserve_are_the_hand_worked_ones(
    reserve, first, revenue, welfare, priority
):
    (out,) = reclear([reserve])
    assert out.reserve == reserve and out.waiting == 3
    assert out.charged[0][0] == first
    assert out.revenue == pytest.approx(revenue, abs=1e-9)
    assert out.welfare == pytest.approx(welfare, abs=1e-9)
    assert out.priority == priority


def test_the_revenue_adds_the_charges_at_every_admitted_place():
    (out,) = reclear([0.0], admitted=[0, 1])
    assert [rid for rid, _ in out.charged] == ["a", "b"]
    assert [c for _, c in out.charged] == pytest.approx([6.0, 2.0], abs=1e-9)
    assert out.revenue == pytest.approx(8.0, abs=1e-9)


def test_the_snapshot_of_a_tree_is_its_shape_and_rebuilds_it():
    # Shared prefixes this time: a and b under one node of 2 tokens, c on its own.
    tree = RequestTree(
        [
            WaitingRequest("a", (1, 2, 3), 3.0, 0.0, cached_len=2, owner="x"),
            WaitingRequest("b", (1, 2, 4, 5), 1.0, 1.0),
            WaitingRequest("c", (9,), 2.0, 2.0),
        ]
    )
    snap = queue_snapshot(tree, overhead_tokens=1, charge_scope="tenant")
    # Nodes breadth-first: [1 2] and [9] under the root, then [3] and [4 5] under [1 2].
    assert snap["parent"] == [-1, -1, 0, 0]
    assert snap["edge"] == [2, 1, 1, 2]
    assert dict(zip(snap["id"], snap["node"], strict=True)) == {"a": 2, "b": 3, "c": 1}
    assert dict(zip(snap["id"], snap["cached"], strict=True)) == {"a": 2, "b": 0, "c": 0}
    assert dict(zip(snap["id"], snap["owner"], strict=True)) == {"a": "x", "b": "", "c": ""}
    assert (snap["overhead_tokens"], snap["charge_scope"]) == (1, "tenant")
    rebuilt = queue_tree(queue_snapshot_checked(snap))
    assert [len(x.children) for x in rebuilt.nodes()] == [len(x.children) for x in tree.nodes()]
    assert [x.ew for x in rebuilt.nodes()] == [x.ew for x in tree.nodes()]
    assert sorted(len(r.tokens) for r in rebuilt) == [1, 3, 4]


def test_a_place_outside_the_queue_is_refused():
    with pytest.raises(ValueError, match="admitted places"):
        reclear([0.0], admitted=[3])


def test_the_grid_holds_no_reserve_the_current_one_and_the_bids():
    # Positive bids 1, 2, 3: the 10%..30% quantiles are 1, 40%..60% 2, 70%..90% 3.
    assert reserve_grid([0.0, 3.0, 1.0, 2.0], current=1.5) == [0.0, 1.0, 1.5, 2.0, 3.0]
    assert reserve_grid([], current=0.25) == [0.0, 0.25]
