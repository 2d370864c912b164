"""Quotes from recent waits (``mechanism.quotes``), against hand-worked histories.

The history: 30 requests bid 0.1 $/s and waited 0.1, 0.2, ..., 3.0 s; 30 bid 0.01 and waited
1, 2, ..., 30 s; 30 bought no priority (bid 0) and waited 10, 20, ..., 300 s. With groups of at
least 20 requests each bid level is a group. Nearest-rank quantiles of 30 waits: the median is
the 15th, the 90th percentile the 27th, the 99th the 30th. A quote judges a group of 30 by its
confident quantile, at p + 2 sqrt(p (1 - p) / 30): for p = 0.5, 0.5 + 0.183 = 0.683, the 21st
wait (ceil(20.5)); for p = 0.9, 0.9 + 0.110 > 1, the 30th; for p = 0.99, the 30th.
"""

from __future__ import annotations

import pytest

from mechanism.quotes import BidGroup, Waited, bid_groups, queue_scaled, quote, waits_for


def history() -> list[Waited]:
    return (
        [Waited(0.1, round(0.1 * i, 1)) for i in range(1, 31)]
        + [Waited(0.01, float(i)) for i in range(1, 31)]
        + [Waited(0.0, 10.0 * i) for i in range(1, 31)]
    )


def test_each_bid_level_of_enough_requests_is_a_group_highest_first() -> None:
    groups = bid_groups(history())
    assert [(g.low, g.high, g.median_bid, len(g.waits)) for g in groups] == [
        (0.1, 0.1, 0.1, 30),
        (0.01, 0.01, 0.01, 30),
        (0.0, 0.0, 0.0, 30),
    ]
    top = groups[0]
    assert (top.quantile(0.5), top.quantile(0.9), top.quantile(0.99)) == (1.5, 2.7, 3.0)


@pytest.mark.parametrize(
    ("ttft_s", "p", "bid"),
    [
        (2.5, 0.5, 0.1),  # 0.1's 21st wait 2.1 s <= 2.5; 0.01's 21 s > 2.5
        (2.0, 0.5, None),  # 0.1's median 1.5 s is within 2 s, but its 21st wait, 2.1 s, is not
        (25.0, 0.5, 0.01),  # 0.01's 21 s <= 25; bid 0's 210 s > 25
        (30.0, 0.9, 0.01),  # 0.01's 30th wait, 30 s <= 30; bid 0's 300 s > 30
        (2.9, 0.9, None),  # 0.1's p90 is 2.7 s, its 30th wait 3.0 s
        (300.0, 0.99, 0.0),  # every group within 300 s: no priority needed
        (210.0, 0.5, 0.0),
    ],
)
def test_the_quote_is_the_lowest_group_that_met_the_target_with_all_above_it(
    ttft_s, p, bid
) -> None:
    assert quote(bid_groups(history()), ttft_s=ttft_s, p=p) == bid


def test_a_group_above_that_missed_the_target_stops_the_walk() -> None:
    """Waits that are not monotone in the bid: the quote never skips a group that missed."""
    odd = (
        [Waited(0.2, 9.0) for _ in range(20)]  # the top bids waited long (a burst)
        + [Waited(0.05, 1.0) for _ in range(20)]
    )
    assert quote(bid_groups(odd), ttft_s=5.0, p=0.5) is None


def test_small_levels_join_until_a_group_is_big_enough() -> None:
    six = [Waited(b, 1.0) for b in (0.6, 0.5, 0.4, 0.3, 0.2, 0.1) for _ in range(8)]
    # 8 + 8 + 8 = 24 >= 20 closes a group at 0.4, and again at 0.1.
    assert [(g.low, g.high, len(g.waits)) for g in bid_groups(six)] == [
        (0.4, 0.6, 24),
        (0.1, 0.3, 24),
    ]
    # Five levels: the last two (16 requests) are too few for a group and join the first.
    five = six[8:]
    assert [(g.low, g.high, len(g.waits)) for g in bid_groups(five)] == [(0.1, 0.5, 40)]


def test_a_group_quotes_its_median_bid() -> None:
    g = bid_groups([Waited(b, 1.0) for b in (0.1, 0.2, 0.3, 0.4) for _ in range(5)])
    assert len(g) == 1 and g[0].median_bid == 0.2  # the 10th of 20 bids, ascending


def test_too_short_a_history_quotes_nothing() -> None:
    assert bid_groups(history()[:19]) == []
    assert quote([], ttft_s=1.0, p=0.5) is None
    assert waits_for([], 0.1) is None


def test_waits_for_a_bid_are_its_groups_or_the_nearest() -> None:
    groups = bid_groups(history())
    assert waits_for(groups, 0.01).median_bid == 0.01
    assert waits_for(groups, 0.05).median_bid == 0.01  # 0.04 from 0.01, 0.05 from 0.1
    assert waits_for(groups, 5.0).median_bid == 0.1
    assert waits_for(groups, 0.001).median_bid == 0.0


def test_quantile_bounds() -> None:
    g = BidGroup(0.0, 0.0, 0.0, (1.0, 2.0))
    assert g.quantile(1.0) == 2.0 and g.quantile(0.5) == 1.0 and g.quantile(0.51) == 2.0
    for p in (0.0, 1.5):
        with pytest.raises(ValueError):
            g.quantile(p)
        with pytest.raises(ValueError):
            g.confident_quantile(p)
    with pytest.raises(ValueError):
        quote([g], ttft_s=0.0, p=0.5)


def test_a_wait_is_scaled_to_the_queue_of_now_never_down() -> None:
    history = [
        Waited(0.1, 0.5, queue_len=100),  # joined 100 waiting; 400 now: 0.5 x 4 = 2.0 s
        Waited(0.1, 0.5, queue_len=500),  # joined a longer queue than now: stays 0.5 s
        Waited(0.0, 3.0, queue_len=1),  # joined an empty queue (itself): 3.0 x 400 = 1200 s
        Waited(0.0, 3.0),  # queue not known: stays 3.0 s
    ]
    scaled = queue_scaled(history, waiting=400)
    assert [w.ttft_s for w in scaled] == [2.0, 0.5, 1200.0, 3.0]
    assert [(w.bid, w.queue_len) for w in scaled] == [(w.bid, w.queue_len) for w in history]
    assert queue_scaled(history, waiting=None) == history  # no book: the history as read
    assert queue_scaled(history, waiting=0) == history  # a drained queue scales nothing down
    with pytest.raises(ValueError):
        queue_scaled(history, waiting=-1)
    with pytest.raises(ValueError):
        queue_scaled(history, waiting=float("nan"))


def test_a_grown_queue_raises_the_quote() -> None:
    # The module's history, each request having joined a queue of 10: the quote for a first
    # token within 2.5 s half the time is 0.1 (its 21st wait 2.1 s). Now 20 wait: every wait
    # doubles, 0.1's 21st is 4.2 s > 2.5, and nothing is quoted; within 5 s, 0.1 (4.2 <= 5).
    # Within 50 s half the time: 0.01's 21 s doubles to 42 s <= 50; bid 0's 210 s doubles to
    # 420 s > 50: the quote stays 0.01, and for p 0.9 within 40 s (0.01's 30th wait, 30 s,
    # doubles to 60 s > 40) it rises to 0.1 (3.0 -> 6.0 s).
    joined = [Waited(w.bid, w.ttft_s, queue_len=10) for w in history()]
    assert quote(bid_groups(joined), ttft_s=2.5, p=0.5) == 0.1
    now = bid_groups(queue_scaled(joined, waiting=20))
    assert quote(now, ttft_s=2.5, p=0.5) is None
    assert quote(now, ttft_s=5.0, p=0.5) == 0.1
    assert quote(now, ttft_s=50.0, p=0.5) == 0.01
    assert quote(bid_groups(joined), ttft_s=40.0, p=0.9) == 0.01
    assert quote(now, ttft_s=40.0, p=0.9) == 0.1


def test_a_quote_needs_the_share_by_a_margin_clear_of_chance() -> None:
    """A group of 20 waited 1, 2, ..., 20 s. For half the time it is judged by its wait at
    0.5 + 2 sqrt(0.25 / 20) = 0.724, the 15th (ceil(14.5)): 15 s, where its median is 10 s.
    For p = 0.8: 0.8 + 2 sqrt(0.16 / 20) = 0.979, the 20th."""
    group = bid_groups([Waited(0.2, float(i)) for i in range(1, 21)])
    assert [g.quantile(0.5) for g in group] == [10.0]
    assert [g.confident_quantile(0.5) for g in group] == [15.0]
    assert quote(group, ttft_s=14.9, p=0.5) is None
    assert quote(group, ttft_s=15.0, p=0.5) == 0.2
    assert group[0].confident_quantile(0.8) == 20.0
    assert quote(group, ttft_s=19.0, p=0.8) is None
