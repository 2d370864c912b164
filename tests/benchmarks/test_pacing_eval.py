"""The autobidder evaluation's accounting (its figures come from the benchmark, not from here)."""

import pytest

from benchmarks import pacing


def test_a_bid_is_funded_by_a_hold_and_never_charged_beyond_it():
    # Budget $1: a request worth 2 $/s with a 0.5 s wait bound may bid 1 / 0.5 = 2 $/s, holding
    # the whole dollar; the next one can bid nothing until that hold is settled.  A charge of
    # $3 is settled at the hold ($1): the budget is spent, not overspent.
    b = pacing.Bidder("naive", 1.0)
    assert b.bid(2.0, 0.5) == (2.0, 1.0)
    assert b.bid(5.0, 0.5) == (0.0, 0.0)
    b.pay(3.0, 1.0)
    assert (b.spent, b.held, b.remaining, b.peak_share) == (1.0, 0.0, 0.0, 1.0)


def test_shading_and_the_baselines():
    b = pacing.Bidder("mu=3", 100.0, mu=3.0)
    assert b.bid(2.0, 1.0)[0] == pytest.approx(0.5)  # value / (1 + mu)
    assert pacing.Bidder("zero", 100.0).bid(2.0, 1.0) == (0.0, 0.0)
    assert pacing.Bidder("value", float("inf")).bid(2.0, 1.0) == (2.0, 0.0)


def test_no_strategy_ever_overspends():
    budgets, results, curves = pacing.evaluate_seed(
        requests=192, load_rps=25.0, seed=1, progress=lambda _: None
    )
    assert set(results) == set(pacing.TENANTS) and set(curves) == set(pacing.TENANTS)
    for tenant, per in results.items():
        assert budgets[tenant] > 0
        for r in per.values():
            assert r.spent <= r.budget * (1 + 1e-9), (tenant, r.strategy)
            assert r.peak_share <= 1 + 1e-9
        # U(zero) = 0 by definition: the baseline saves nothing and pays nothing.
        assert per["zero"].utility == pytest.approx(0.0) and per["zero"].spent == 0.0
