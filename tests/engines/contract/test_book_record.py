"""The order book as a round record carries it: who waits in each subtree, where each subtree
leaves its parent, and the waiting bids (the console's book for operators).

A hand-built queue of five requests (token ids, tenant tags and bids written out below), so every
expectation is read off the tree drawn here, not off the code:

    root
    ├── 1 2 3 4                      acme's system prompt (tags "1" = acme, "2" = globex)
    │   ├── 10 11                    one program's instructions
    │   │   ├── 100    a1  tag 1  0.02 $/s
    │   │   └── 101    a2  tag 2  0.004 $/s
    │   └── 20 21 102  a3  tag 1  0.05 $/s
    └── 5 6 7
        ├── 30         b1  tag 2  0.001 $/s
        └── 31         b2  no tag 0 $/s
"""

from __future__ import annotations

import pytest

from engines.contract.writer import subtree_summaries, token_label, waiting_bids
from mechanism import RequestTree, WaitingRequest, clear_tree

QUEUE = [
    ("a1", (1, 2, 3, 4, 10, 11, 100), "1", 0.02),
    ("a2", (1, 2, 3, 4, 10, 11, 101), "2", 0.004),
    ("a3", (1, 2, 3, 4, 20, 21, 102), "1", 0.05),
    ("b1", (5, 6, 7, 30), "2", 0.001),
    ("b2", (5, 6, 7, 31), "", 0.0),
]


def tree() -> RequestTree:
    return RequestTree(
        [
            WaitingRequest(rid, tokens, bid, arrival=i, owner=owner)
            for i, (rid, tokens, owner, bid) in enumerate(QUEUE)
        ]
    )


@pytest.mark.parametrize("policy", ["fcfs", "dfs-auction-density"])  # walked, and off the plan
def test_each_subtree_says_whose_requests_wait_in_it_and_where_it_leaves_its_parent(policy):
    t = tree()
    rows = {row["label"]: row for row in subtree_summaries(t, clear_tree(t, policy), token_label)}
    assert sorted(rows) == ["1 2 3 4", "1 2 3 4 10 11", "1 2 3 4 20 21 102", "5 6 7", "5 6 7 30",
                            "5 6 7 31"]  # fmt: skip
    acme, other = rows["1 2 3 4"], rows["5 6 7"]
    assert (acme["parent"], acme["branch"], acme["owners"]) == ("", "1 2 3 4", {"1": 2, "2": 1})
    assert (other["parent"], other["branch"], other["owners"]) == ("", "5 6 7", {"": 1, "2": 1})
    # Siblings share their parent's prefix, and so the start of their labels: the branch is
    # what tells them apart.
    expected = {
        "1 2 3 4 10 11": (acme["key"], "10 11", {"1": 1, "2": 1}),
        "1 2 3 4 20 21 102": (acme["key"], "20 21 102", {"1": 1}),
        "5 6 7 30": (other["key"], "30", {"2": 1}),
        "5 6 7 31": (other["key"], "31", {"": 1}),
    }
    for label, (parent, branch, owners) in expected.items():
        row = rows[label]
        assert (row["depth"], row["parent"], row["branch"], row["owners"]) == (
            2, parent, branch, owners
        ), label  # fmt: skip
    assert sum(rows[k]["requests"] for k in ("1 2 3 4", "5 6 7")) == 5


def test_a_record_with_the_book_carries_the_waiting_bids_sorted_or_an_even_sample():
    assert waiting_bids(tree()) == [0.0, 0.001, 0.004, 0.02, 0.05]
    # Three of five: the lowest, the middle one and the highest (sorted positions 0, 2, 4).
    assert waiting_bids(tree(), limit=3) == [0.0, 0.004, 0.05]
    # As requests leave and bids change: a3 (0.05) admitted, b2 now bids 0.03.
    t = tree()
    t.remove("a3")
    t.update("b2", bid=0.03)
    assert waiting_bids(t) == [0.001, 0.004, 0.02, 0.03]


def test_a_record_whose_waiting_bids_are_not_amounts_is_refused():
    from engines.contract.records import round_record_checked
    from tests.market.live_helpers import record

    good = {**record("m", 1), "waiting_bids": [0, 0.001, 2]}
    assert round_record_checked(good)["waiting_bids"] == [0, 0.001, 2]
    for bad in ([-0.001], ["0.1"], [True], [float("nan")], 0.1):
        with pytest.raises(ValueError, match="waiting_bids"):
            round_record_checked({**record("m", 1), "waiting_bids": bad})


def test_an_admitted_requests_place_in_line_is_optional_but_whole_when_there():
    from engines.contract.records import auction_fields, round_record_checked
    from tests.market.live_helpers import admitted, record

    old = record("m", 1, admitted_requests=[admitted("r1")])  # an engine from before the fields
    assert "rank" not in auction_fields(old, round_record_checked(old)["admitted"][0])
    placed = {**admitted("r2"), "rank": 3, "ahead": 2, "queue_len": 7}
    new = record("m", 2, admitted_requests=[placed])
    fields = auction_fields(new, round_record_checked(new)["admitted"][0])
    assert (fields["rank"], fields["ahead"], fields["queue_len"]) == (3, 2, 7)
    for name, bad in [("rank", "3"), ("ahead", 1.5), ("queue_len", True)]:
        broken = record("m", 3, admitted_requests=[{**placed, name: bad}])
        with pytest.raises(ValueError, match=name):
            round_record_checked(broken)
