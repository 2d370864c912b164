"""The automatic wait bound (mechanism.wait_bound), worked by hand in the comments.

The rule: target = 8 x the mean of the newest 512 waits (none under 32), within 2..600 s; the
bound stays while the target is within 25% of it (bound / 1.25 <= target <= bound x 1.25);
above, it goes to the target; below, it falls by 1/8, at most down to the target; to 2
significant digits (Python's round: a half goes to the even digit), within 2..600 s.
"""

from __future__ import annotations

import math

import pytest

from mechanism import RequestTree, clear_tree, wait_bound
from mechanism.aging import AgeCredit
from mechanism.book import subtree_book
from mechanism.requests import BID_SCALE
from mechanism.wait_bound import ranks_as, significant, wait_bound_renewed, wait_bound_target


def test_the_constants_the_examples_below_are_worked_with() -> None:
    assert (wait_bound.MULTIPLE, wait_bound.WINDOW, wait_bound.MIN_SAMPLES) == (8.0, 512, 32)
    assert (wait_bound.AUTO_MIN_S, wait_bound.AUTO_MAX_S) == (2, 600)
    assert (wait_bound.DEADBAND, wait_bound.FALL) == (0.25, 0.125)
    assert wait_bound.PRIOR_S == 20.0  # the fixed bound that held the tail on production traces


@pytest.mark.parametrize(
    ("value", "expected"),
    [(23.456, 23.0), (4.567, 4.6), (0.5, 0.5), (109.54, 110.0), (17.5, 18.0), (3150.0, 3200.0)],
)
def test_two_significant_digits(value: float, expected: float) -> None:
    assert significant(value) == expected


@pytest.mark.parametrize(
    ("waits", "expected"),
    [
        ([4.0] * 31, None),  # under 32 served: no evidence
        ([4.0] * 32, 32.0),  # 8 x 4
        ([1.0] * 16 + [7.0] * 16, 32.0),  # mean 4: 8 x 4
        ([0.1] * 40, 2.0),  # 8 x 0.1 = 0.8, raised to the 2 s floor
        ([300.0] * 40, 600.0),  # 2400, cut to the 600 s ceiling
        ([10.0] * 512 + [1000.0] * 1000, 80.0),  # only the newest 512 count: 8 x 10
        ([4.0] * 32 + [math.nan, -1.0, math.inf], 32.0),  # what is no wait is left out
    ],
)
def test_the_target_is_eight_mean_waits(waits: list[float], expected: float | None) -> None:
    assert wait_bound_target(waits) == expected


@pytest.mark.parametrize(
    ("bound", "waits", "expected"),
    [
        (20.0, [4.0] * 31, 20.0),  # no evidence: stays
        (20.0, [2.0] * 32, 20.0),  # target 16 >= 20 / 1.25 = 16: within the band, stays
        (20.0, [3.0] * 32, 20.0),  # 24 <= 20 x 1.25 = 25: stays
        (20.0, [4.0] * 32, 32.0),  # 32 > 25: up to the target at once
        (20.0, [300.0] * 40, 600.0),  # 2400, cut to 600: at once
        (20.0, [1.5] * 32, 18.0),  # 12 < 16: down an eighth, 17.5 -> 18 (half to even)
        (18.0, [1.5] * 32, 16.0),  # 12 < 14.4: 15.75 -> 16
        (16.0, [1.5] * 32, 14.0),  # 12 < 12.8: 14
        (14.0, [1.5] * 32, 14.0),  # 12 >= 11.2: stays
        (20.0, [0.1] * 40, 18.0),  # target 2 s: down an eighth only
        (3.0, [0.1] * 40, 2.6),  # 2 < 2.4: 2.625 -> 2.6
        (2.5, [0.1] * 40, 2.5),  # 2 >= 2.5 / 1.25: stays
        (2.1, [0.1] * 40, 2.1),  # below the band's edge only by rounding: stays
        (3600.0, [1.0] * 32, 600.0),  # a pinned hour turned auto: 3150, cut to 600
        (3600.0, [100.0] * 32, 600.0),  # target 800, cut to 600; the fall's 3150 too
    ],
)
def test_the_bound_rises_at_once_and_falls_by_an_eighth(
    bound: float, waits: list[float], expected: float
) -> None:
    assert wait_bound_renewed(bound, waits) == expected


def test_it_settles_within_the_band_of_the_target_from_anywhere() -> None:
    """Renewed with the same waits, the bound ends within 25% (and a rounding) of 8 x the mean,
    whatever it started at, and then stays."""
    for mean in (0.05, 0.4, 1.0, 3.3, 9.0, 40.0, 150.0):
        target = min(600.0, max(2.0, 8 * mean))
        for start in (2.0, 7.0, 20.0, 90.0, 600.0, 3600.0):
            bound = start
            for _ in range(60):  # 600 s to 2 s at 7/8 a renewal: 43 renewals
                bound = wait_bound_renewed(bound, [mean] * 64)
            assert target / 1.3 <= bound <= target * 1.3, (mean, start, bound)
            assert wait_bound_renewed(bound, [mean] * 64) == bound


def test_a_bound_that_is_no_bound_is_refused() -> None:
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="must be > 0 seconds"):
            wait_bound_renewed(bad, [1.0] * 40)


def test_what_a_bid_ranks_as_once_it_has_waited() -> None:
    # A 20 s bound in 16 steps of 1.25 s, $0.004/s per token: a 1,000-token prompt earns
    # $4/s at the bound, $0.25/s a step.
    credit = AgeCredit(20.0, 0.004, 16)
    assert ranks_as(0.01, prompt_tokens=1000, waited_s=20.0, credit=credit) == 4.01
    assert ranks_as(0.01, prompt_tokens=1000, waited_s=600.0, credit=credit) == 4.01  # at most
    assert ranks_as(0.01, prompt_tokens=1000, waited_s=10.0, credit=credit) == 2.01  # 8 steps
    assert ranks_as(0.01, prompt_tokens=1000, waited_s=9.9, credit=credit) == 1.76  # 7 steps
    assert ranks_as(0.0, prompt_tokens=1000, waited_s=1.0, credit=credit) == 0.0  # none yet


def test_the_book_shows_each_subtrees_credits_beside_its_bids() -> None:
    # The queue of test_examples.py, D credited $3/s and C $1/s. Root's children: X = [1 2]
    # (A, B, D: bids 1 + 4 + 0 = 5, credits 3, over 7 uncached tokens: density 8/7) and C's
    # leaf (bid 2, credit 1, over 4: 3/4): X first. Below X: Y = [3] (A, B: 5 over 6, no
    # credit: 5/6) and D's leaf (bid 0, credit 3, over its 1 uncached token: 3): D first.
    from tests.mechanism.test_examples import queue

    for policy in ("dfs-auction-density", "dfs-auction-kv-split", "lpm"):
        tree = RequestTree(queue())
        tree.set_credit("D", 3 * BID_SCALE)
        tree.set_credit("C", 1 * BID_SCALE)
        c = clear_tree(tree, policy, tokens_per_second=1.0, overhead_tokens=0)
        rows = {tuple(r.prefix): r for r in subtree_book(tree, c, max_depth=2)}
        got = {p: (r.requests, r.bid_sum, r.credit_sum, r.work) for p, r in rows.items()}
        assert got == {
            (1, 2): (3, 5.0, 3.0, 7),
            (9, 9, 9, 9): (1, 2.0, 1.0, 4),
            (1, 2, 3): (2, 5.0, 0.0, 6),
            (1, 2, 10): (1, 0.0, 3.0, 1),
        }, policy
        densities = {p: r.density for p, r in rows.items()}
        assert densities == pytest.approx(
            {(1, 2): 8 / 7, (9, 9, 9, 9): 3 / 4, (1, 2, 3): 5 / 6, (1, 2, 10): 3.0}
        )
        if policy == "dfs-auction-density":  # the credits rank: D ahead of Y, X ahead of C
            assert (rows[(1, 2, 10)].rank, rows[(1, 2, 3)].rank) == (0, 1)
            assert (rows[(1, 2)].rank, rows[(9, 9, 9, 9)].rank) == (0, 1)
