"""The automatic reserve's step (mechanism.reserve), worked by hand in the comments."""

from __future__ import annotations

import pytest

from mechanism.reserve import Finished, priority_wait_s, reserve_moved, reserve_step


def moved(reserve: float, wait_s: float | None, *, served: bool = True) -> float:
    return reserve_moved(reserve, wait_s=wait_s, target_s=2.0, served=served, ceiling=1.0)


@pytest.mark.parametrize(
    ("reserve", "wait_s", "expected"),
    [
        (0.001, 4.0, 0.001125),  # (4 - 2) / 2 = 1: the full step up, x 9/8
        (0.001, 9.0, 0.001125),  # 3.5, clamped to 1: still x 9/8
        (0.001, 2.5, 0.00103125),  # 0.25: x (1 + 1/32)
        (0.001, 2.0, 0.001),  # on target: stays
        (0.001, 1.0, 0.0009375),  # -0.5: x (1 - 1/16)
        (0.001, 0.0, 0.000875),  # -1: the full step down, x 7/8
        (0.001, None, 0.000875),  # served, none bought priority: demand under the target
        (0.0, 3.0, 1e-6),  # from no reserve, a rise starts at the tick
        (5e-7, 3.0, 1e-6),  # under the tick, a rise goes to the tick (x 1.0625 is less)
        (0.0, 1.0, 0.0),  # no reserve and a short wait: stays at none
        (1.2e-6, 0.0, 1.05e-6),  # x 7/8, still above the tick
        (1.1e-6, 0.0, 0.0),  # x 7/8 = 9.625e-7, under the tick: no reserve
        (0.95, 4.0, 1.0),  # x 9/8 = 1.06875, cut to the ceiling of 1 $/s
    ],
)
def test_a_step_moves_by_the_clamped_relative_gap(reserve, wait_s, expected):
    assert moved(reserve, wait_s) == pytest.approx(expected, rel=1e-12, abs=0)


def test_an_interval_that_served_nothing_keeps_the_reserve():
    assert moved(0.001, None, served=False) == 0.001
    assert moved(0.0, None, served=False) == 0.0


def test_the_step_compounds_at_most_an_eighth_per_interval():
    # Three intervals at twice the target: 0.001 x (9/8)^3 = 0.001423828125.
    r = 0.001
    for _ in range(3):
        r = moved(r, 4.0)
    assert r == pytest.approx(0.001423828125, rel=1e-12)


def test_the_wait_is_the_p90_of_the_requests_whose_bids_buy_priority():
    # Ten bids at or above the reserve of 0.01 $/s, waiting 1..10 s: the 90th percentile by the
    # nearest rank is the 9th smallest, 9 s. Bids under the reserve (waiting 100 s) and zero bids
    # do not count.
    finished = [Finished(bid=0.01 + 0.001 * i, ttft_s=float(i + 1)) for i in range(10)]
    finished += [Finished(bid=0.009, ttft_s=100.0), Finished(bid=0.0, ttft_s=100.0)]
    assert priority_wait_s(finished, reserve=0.01) == (9.0, 10)
    # With no reserve every positive bid buys priority, a zero bid still does not: the 11 waits
    # 1..10 and 100: the 9.9th, rounded up the 10th smallest, 10 s.
    assert priority_wait_s(finished, reserve=0.0) == (10.0, 11)
    assert priority_wait_s([Finished(0.001, 5.0)], reserve=0.01) == (None, 0)


def test_one_interval_measures_and_moves():
    finished = [Finished(bid=0.02, ttft_s=float(i + 1)) for i in range(10)]
    finished.append(Finished(bid=0.001, ttft_s=50.0))
    step = reserve_step(0.01, finished, target_s=6.0, ceiling=1.0)
    # p90 = 9 s against 6 s: (9 - 6) / 6 = 0.5, x (1 + 1/16) = 0.010625
    assert step.wait_s == 9.0
    assert (step.priority, step.served) == (10, 11)
    assert step.reserve == pytest.approx(0.010625, rel=1e-12)
    # The same interval with no request finished: nothing known, nothing moves.
    assert reserve_step(0.01, [], target_s=6.0, ceiling=1.0).reserve == 0.01


@pytest.mark.parametrize("target_s", [0.0, -1.0, float("nan")])
def test_a_target_must_be_a_positive_wait(target_s):
    with pytest.raises(ValueError, match="target wait"):
        reserve_moved(0.01, wait_s=1.0, target_s=target_s, served=True, ceiling=1.0)
