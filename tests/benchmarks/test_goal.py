"""The market's goal on hand-made metrics (benchmarks/goal.py)."""

import math

from benchmarks.goal import capture, checked_policies, goals
from benchmarks.metrics import PolicyMetrics


def _m(ttft: float, hit: float, welfare: float, p99: float | None = None) -> PolicyMetrics:
    return PolicyMetrics(ttft, ttft, ttft if p99 is None else p99, ttft, hit, 1.0, welfare, 0.0)


def test_capture_is_the_share_of_highest_bids_gain() -> None:
    # lpm loses $100, highest-bid $20: a policy losing $36 captures (100 - 36) / 80 = 0.8.
    assert capture(-36.0, -100.0, -20.0) == 0.8
    assert capture(-100.0, -100.0, -20.0) == 0.0
    assert capture(-140.0, -100.0, -20.0) == -0.5
    # highest-bid gains under 1% of lpm's loss: nothing to capture.
    assert math.isnan(capture(-99.0, -100.0, -99.5))
    assert math.isnan(capture(-99.0, -100.0, -120.0))


def test_each_check_against_its_own_reference() -> None:
    metrics = {
        "lpm": _m(10.0, 0.80, -100.0, p99=40.0),
        "dfs-weight": _m(8.0, 0.85, -110.0, p99=20.0),
        "highest-bid": _m(30.0, 0.50, -20.0),
        # hit 0.795 (-0.5 pp vs lpm, not vs dfs-weight), TTFT 8.4 = 1.05 x 8, capture 0.8,
        # p99 50 = 1.25 x lpm's 40 (not dfs-weight's 20)
        "dfs-auction-kv": _m(8.4, 0.795, -36.0, p99=50.0),
        # hit -2 pp, TTFT 8.5 / 8 = 1.0625, capture 0.5, p99 50.4 / 40 = 1.26
        "dfs-auction": _m(8.5, 0.78, -60.0, p99=50.4),
    }
    got = goals(metrics, checked_policies(list(metrics)))
    assert set(got) == {"dfs-auction-kv", "dfs-auction"}  # not highest-bid, nor the bid-blind
    kv, avg = got["dfs-auction-kv"], got["dfs-auction"]
    assert kv.passes == (True, True, True, True) and kv.met
    assert avg.passes == (False, False, False, False) and not avg.met
    assert abs(kv.hit_gap_pp + 0.5) < 1e-9 and abs(avg.ttft_vs_best - 1.0625) < 1e-12
    assert abs(avg.tail_vs_lpm - 1.26) < 1e-12
    # Without a policy to compare with, there is no goal to check.
    assert goals({k: v for k, v in metrics.items() if k != "highest-bid"}, ["dfs-auction"]) == {}


def test_a_point_with_nothing_to_capture_meets_the_goal_on_the_other_two() -> None:
    metrics = {
        "lpm": _m(1.0, 0.8, -10.0),
        "dfs-weight": _m(1.0, 0.8, -10.0),
        "highest-bid": _m(1.0, 0.8, -10.0),
        "dfs-auction-kv": _m(1.0, 0.8, -10.0),
    }
    g = goals(metrics, ["dfs-auction-kv"])["dfs-auction-kv"]
    assert g.passes == (True, True, None, True) and g.met
    assert g.as_dict()["capture_ok"] is None


def test_a_tail_past_the_bound_misses_the_goal_alone() -> None:
    # Mean, hit and capture all pass; p99 13 s against lpm's 10 s is 1.3 > 1.25.
    metrics = {
        "lpm": _m(4.0, 0.8, -100.0, p99=10.0),
        "dfs-weight": _m(4.0, 0.8, -100.0, p99=9.0),
        "highest-bid": _m(4.0, 0.8, -20.0, p99=30.0),
        "dfs-auction-density": _m(4.0, 0.8, -20.0, p99=13.0),
    }
    g = goals(metrics, ["dfs-auction-density"])["dfs-auction-density"]
    assert g.passes == (True, True, True, False) and not g.met
    assert g.as_dict()["tail_ok"] is False
