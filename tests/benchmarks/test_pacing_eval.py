"""The autobidder evaluation's accounting (its figures come from the benchmark, not from here)."""

import dataclasses
import math

import pytest

from benchmarks import pacing


def focal(strategy: str, budget: float) -> pacing._Focal:
    spec = pacing.Spec(0, "A", strategy, budget, 0.5)
    return pacing._Focal(spec, pacing.Setup(period_s=10.0, updates=10), 1.0, 2.0)


def test_the_safety_rule_by_hand():
    # Budget $1, exposure factor 0.1. A request worth 2 $/s with a 0.5 s wait bound (worst case
    # $1) fits: 1 - 0 >= 0.1 x 1. In flight $1 reserves 0.1; the next fits too (0.9 left, it
    # costs at most 0.1 x 0.5 per $/s). Charges: 0.8 (paid in full), then 0.7 of which only the
    # 0.2 left is paid: 0.5 uncollected, and the budget is spent exactly, never overspent.
    f = focal("mu=0", 1.0)
    f.exposure.factor = 0.1
    assert f.bid("r1", 2.0, 0.5) == 2.0
    assert f.bid("r2", 2.0, 0.5) == 2.0
    f.settle("r1", 0.8, 1.0, 0.0, 10.0)
    f.settle("r2", 0.7, 6.0, 0.0, 10.0)
    out = f.out
    assert (out.paid, out.uncollected, out.consent_cut) == (1.0, pytest.approx(0.5), 0.0)
    assert out.peak == 1.0 and out.quarters == [0.8, 0.0, pytest.approx(0.2), 0.0]
    assert f.bid("r3", 2.0, 0.5) == 0.0  # nothing left


def test_a_charge_above_the_consent_cap_is_cut_to_it():
    # Factor 1 (no history): the bid is capped at 1 / 0.5 = 2 $/s, its worst case the whole
    # dollar; the next bids nothing until it settles. A $3 charge is cut to the $1 consented.
    f = focal("mu=0", 1.0)
    assert f.bid("r1", 5.0, 0.5) == 2.0
    assert f.bid("r2", 5.0, 0.5) == 0.0
    f.settle("r1", 3.0, 1.0, 0.0, 10.0)
    assert (f.out.paid, f.out.consent_cut, f.out.uncollected) == (1.0, 2.0, 0.0)


def test_shading_and_the_baselines():
    assert focal("mu=3", 100.0).bid("r", 2.0, 1.0) == pytest.approx(0.5)  # value / (1 + mu)
    assert focal("zero", 100.0).bid("r", 2.0, 1.0) == 0.0
    assert focal("free", math.inf).bid("r", 2.0, 1.0) == 2.0


def test_the_interval_by_hand():
    # 1, 2, 3: mean 2, sd 1, t(0.975, 2) = 4.303: 2 -/+ 4.303 / sqrt(3).
    mean, lo, hi = pacing.interval([1.0, 2.0, 3.0])
    half = 4.303 / math.sqrt(3)
    assert (mean, lo, hi) == (2.0, pytest.approx(2 - half), pytest.approx(2 + half))
    assert pacing.t975(15) == 2.131 and pacing.t975(40) == 1.96


def test_no_strategy_ever_overspends_and_zero_saves_nothing(monkeypatch):
    monkeypatch.setattr(pacing, "WARMUP_S", 10.0)  # a short run: the accounting, not the figures
    setup = pacing.Setup(period_s=2.0, updates=20)
    free = pacing.run(pacing.Spec(3, "A", "free"), setup)
    zero = pacing.run(pacing.Spec(3, "A", "zero"), setup)
    assert free.requests > 30 and free.paid > 0
    assert pacing.scored(zero, zero).utility == 0.0 and zero.paid == 0.0
    for strategy in ("pacing", "mu=0", "mu=2"):
        spec = pacing.Spec(3, "A", strategy, free.paid * 0.5, 0.5)
        out = pacing.run(spec, setup)
        assert out.paid <= spec.budget * (1 + 1e-12) and out.peak <= spec.budget * (1 + 1e-12)
        assert out.settled == out.requests  # every period request's charge settled
        r = pacing.scored(out, zero)
        assert r.utility == pytest.approx(zero.cost - out.cost - out.paid)
        assert 0 < r.spend_over_budget <= 1 + 1e-12


def test_the_charge_scope_comparison_scores_both_scopes(monkeypatch):
    from benchmarks import charge_scope
    from benchmarks.progress import Progress

    monkeypatch.setattr(pacing, "WARMUP_S", 10.0)
    monkeypatch.setattr(charge_scope, "MUS", (0.0, 1.0))
    base = pacing.Setup(period_s=2.0, updates=20)
    got = charge_scope.compare(
        seeds=(5,), tenant="A", progress=Progress(4, enabled=False), base=base
    )
    for scope in ("request", "tenant"):
        setup = dataclasses.replace(base, charge_scope=scope)
        zero = pacing.run(pacing.Spec(5, "A", "zero"), setup)
        free = pacing.run(pacing.Spec(5, "A", "free"), setup)
        assert got[scope]["utility_by_mu"][0.0] == pytest.approx(zero.cost - free.cost - free.paid)
        assert got[scope]["free_paid_mean"] == pytest.approx(free.paid)
