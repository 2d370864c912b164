"""The pacing agent and the safety rule: the update rule by hand, and their bounds as properties."""

import math
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanism.pacing import (
    DUAL_STEP_ONLY,
    FALL_BY_MU,
    PATH_TERM,
    Exposure,
    PacingAgent,
    exposure_factor,
    mu_max_for,
    safe_bid,
)


def agent(**kw):
    base = {
        "budget": 100.0,
        "period_s": 1000.0,
        "values": {"interactive": 2.0, "batch": 0.5},
        "updates": 100,
        "mu_max": 1000.0,
    }
    return PacingAgent(**{**base, **kw})


def test_a_fresh_agent_bids_its_values():
    a = agent()
    assert a.shaded("interactive") == 2.0
    assert a.shaded("batch") == 0.5


def test_the_dual_step_alone_by_hand():
    # The rule in force (the defaults: no path term, bursts counted up to 21x the target).
    # eta = eta0 / sqrt(T) = 1 / sqrt(100) = 0.1. Budget 100 over 1000 s: the first 10 s should
    # spend 100 x 10 / 1000 = 1 dollar. Spending 3: gradient 3/1 - 1 = 2, so log(1 + mu) goes
    # from 0 to 0.2: mu = e^0.2 - 1 = 0.2214; bids / 1.2214.
    a = agent(eta0=1.0, **DUAL_STEP_ONLY)
    assert a.eta == pytest.approx(0.1)
    assert a.observe(3.0, 10.0) == pytest.approx(math.exp(0.2) - 1)
    assert a.shaded("interactive") == pytest.approx(2.0 / math.exp(0.2))
    # Next 10 s: 97 left over 990 s, target 0.9798; spending 0: gradient -1, log(1 + mu) = 0.1.
    assert a.observe(0.0, 10.0) == pytest.approx(math.exp(0.1) - 1)
    assert a.spent == pytest.approx(3.0) and a.elapsed_s == pytest.approx(20.0)
    # Twice more nothing: down to 0, and it stays there (projected).
    a.observe(0.0, 10.0)
    assert a.observe(0.0, 10.0) == 0.0


def test_the_dual_step_alone_counts_a_burst_up_to_its_clip():
    # 100x the target: the gradient 99 is clipped at 20, log(1 + mu) = 0.1 x 20 = 2.
    a = agent(eta0=1.0, **DUAL_STEP_ONLY)
    assert a.observe(100.0 * a.target(10.0), 10.0) == pytest.approx(math.exp(2.0) - 1)


def test_the_end_guard_limits_the_rise_and_counts_what_it_held():
    # In the last tenth of the period a step raises log(1 + mu) by at most eta (0.1). At 950 s
    # with 50 spent the target is 50 x 10 / 50 = 10; spending 100 is gradient 9: held back
    # 0.1 x (9 - 1) = 0.8.
    a = agent(eta0=1.0, elapsed_s=950.0, spent=50.0, **DUAL_STEP_ONLY)
    assert a.observe(10 * a.target(10.0), 10.0) == pytest.approx(math.exp(0.1) - 1)
    assert a.guard_held == pytest.approx(0.8)


def test_the_path_term_by_hand():
    # The design tried (PATH_TERM). Budget 100 over 1000 s, path gain 3, eta 0.1. The first
    # 10 s should spend 1 dollar (the target, and the even path at 10 s). Spending 21 (a burst
    # of 21x): the dual step counts it as gradient +1 only (clip 1): 0.1; the spend is 20 ahead
    # of the even path, 0.2 of the budget: the path term adds 3 x 0.2 = 0.6. log(1 + mu) = 0.7.
    a = agent(eta0=1.0, path_gain=3.0, **PATH_TERM)
    assert a.ahead() == 0.0
    assert a.observe(21.0, 10.0) == pytest.approx(math.expm1(0.7))
    assert a.ahead() == pytest.approx(0.2)
    # Then 40 s with nothing spent, in one step: the even path is at 50 s x 0.1 = 5, the spend
    # still 21: 0.16 ahead, a path term of 0.48. The target was 79 x 40 / 990 = 3.19, the
    # gradient -1: the dual step's level 0.1 - 0.1 = 0. log(1 + mu) = 0.48.
    assert a.observe(0.0, 40.0) == pytest.approx(math.expm1(0.48))
    # 450 s more with nothing spent: at 500 s the path is at 50, the spend 21 behind it, so
    # the term is 0 and the dual step's level falls to 0. Behind the path the dual step acts
    # alone: the next 10 s should spend 79 x 10 / 500 = 1.58; twice that is gradient +1: 0.1.
    assert a.observe(0.0, 450.0) == 0.0
    assert a.observe(2 * 79.0 * 10 / 500, 10.0) == pytest.approx(math.expm1(0.1))
    assert a.ahead() == 0.0


def test_the_defaults_are_the_dual_step_alone_and_the_path_term_is_off_with_gain_0():
    assert {k: getattr(agent(), k) for k in DUAL_STEP_ONLY} == DUAL_STEP_ONLY
    # With path_gain 0 the same burst moves it by the clipped gradient only.
    a = agent(eta0=1.0, path_gain=0.0, gradient_clip=1.0)
    assert a.observe(21.0, 10.0) == pytest.approx(math.expm1(0.1))


def test_the_fall_by_mu_by_hand():
    # The second design tried (FALL_BY_MU), fall gain 3, eta 0.1. An interval with nothing spent
    # is gradient -1. At mu = 1 the step down is 1 + 3 / 2^2 = 1.75 times as long: log(1 + mu)
    # from log 2 to log 2 - 0.175. At mu = 9 it is 1 + 3 / 100 = 1.03 times: log 10 - 0.103.
    # A step up is the rule in force's: spending twice the target is +0.1.
    for mu, fall in ((1.0, 0.175), (9.0, 0.103)):
        a = agent(eta0=1.0, mu=mu, **{**FALL_BY_MU, "fall_gain": 3.0})
        assert a.observe(0.0, 10.0) == pytest.approx(math.exp(math.log(1 + mu) - fall) - 1)
        a = agent(eta0=1.0, mu=mu, **{**FALL_BY_MU, "fall_gain": 3.0})
        assert a.observe(2 * a.target(10.0), 10.0) == pytest.approx((1 + mu) * math.exp(0.1) - 1)
    # With fall gain 0 (the rule in force) the same empty interval is one step of 0.1.
    assert agent(eta0=1.0, mu=1.0).observe(0.0, 10.0) == pytest.approx(2 * math.exp(-0.1) - 1)


def test_mu_is_clipped_at_mu_max():
    a = agent(eta0=50.0, mu_max=3.0)
    a.observe(50.0, 10.0)
    assert a.mu == pytest.approx(3.0)
    assert a.shaded("interactive") == pytest.approx(2.0 / 4.0)


def test_mu_max_by_hand():
    # Value 2 $/s, 5 requests a second, wait bound 4 s, target 0.1 $/s: 1 + mu = 2 x 5 x 4 / 0.1
    # = 400. At mu = 399 each bid is 0.005 $/s; 5 a second each charged 0.005 x 4 = 0.1 $/s.
    assert mu_max_for(value_max=2.0, arrival_rate=5.0, wait_bound_s=4.0, target_rate=0.1) == 399.0
    assert mu_max_for(value_max=0.01, arrival_rate=1.0, wait_bound_s=1.0, target_rate=1.0) == 1.0


def test_a_new_period_starts_where_the_last_ended():
    a = agent()
    a.observe(5.0, 10.0)
    b = a.next_period(budget=50.0)
    assert b.mu == a.mu and b.spent == 0.0 and b.elapsed_s == 0.0 and b.budget == 50.0


def test_bad_configuration_and_classes():
    with pytest.raises(ValueError, match="budget"):
        agent(budget=-1.0)
    with pytest.raises(ValueError, match="period_s"):
        agent(period_s=0.0)
    with pytest.raises(ValueError, match="updates"):
        agent(updates=0)
    with pytest.raises(ValueError, match="value of class 'x'"):
        agent(values={"x": float("nan")})
    with pytest.raises(ValueError, match="'other'"):
        agent().shaded("other")


def test_exposure_factor_by_hand():
    # 40 ratios 0.01 .. 0.40: the 95% quantile is the 38th, 0.38; the 99% (the default) the
    # 40th, 0.40. Fewer than 32: the worst case.
    ratios = [k / 100 for k in range(1, 41)]
    assert exposure_factor(ratios, quantile=0.95) == pytest.approx(0.38)
    assert exposure_factor(ratios) == pytest.approx(0.40)
    assert exposure_factor(ratios[:31]) == 1.0
    e = Exposure(window=10, min_samples=5, quantile=0.95)
    for k in range(1, 21):
        e.observe(charge=k, worst_case=100.0)
    assert len(e.ratios) == 10 and e.update() == pytest.approx(0.20)


def test_safe_bid_by_hand():
    # $10 left, $60 of worst cases in flight at factor 0.1: $6 reserved, $4 available; a new
    # request with a 20 s bound costs at most 0.1 x 20 = 2 per $/s: at most 2 $/s.
    kw = {"remaining": 10.0, "in_flight": 60.0, "factor": 0.1, "wait_bound_s": 20.0}
    assert safe_bid(shaded=1.5, **kw) == 1.5
    assert safe_bid(shaded=3.0, **kw) == pytest.approx(2.0)
    assert safe_bid(shaded=3.0, **{**kw, "in_flight": 100.0}) == 0.0  # nothing beyond the reserve
    # The same in Decimal, exactly (the gateway's bids).
    got = safe_bid(
        shaded=Decimal("3"),
        remaining=Decimal("10"),
        in_flight=Decimal("60"),
        factor=Decimal("0.1"),
        wait_bound_s=Decimal("20"),
    )
    assert got == Decimal("2")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 50), st.floats(0.1, 100)), max_size=40),
    st.floats(0.01, 10),
)
def test_bounds_hold_for_any_spending(steps, eta0):
    a = agent(eta0=eta0)
    for spent, interval in steps:
        a.observe(spent, interval)
        assert 0.0 <= a.mu <= a.mu_max
        for cls, value in a.values.items():
            assert 0.0 < a.shaded(cls) <= value


@settings(max_examples=300, deadline=None)
@given(
    st.floats(0, 10),
    st.floats(0, 100),
    st.floats(0, 100),
    st.floats(0.001, 1),
    st.floats(0.01, 100),
)
def test_a_safe_bid_fits_what_is_left_beyond_the_reserve(shaded, remaining, flight, f, bound):
    b = safe_bid(shaded=shaded, remaining=remaining, in_flight=flight, factor=f, wait_bound_s=bound)
    assert 0.0 <= b <= shaded
    # Its expected worst case plus the reserve fits what is left.
    assert b == 0.0 or f * (flight + b * bound) <= remaining * (1 + 1e-9) + 1e-12


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 5), st.floats(0, 5))
def test_a_larger_multiplier_never_bids_more(mu1, mu2):
    lo, hi = sorted((mu1, mu2))
    assert agent(mu=hi).shaded("interactive") <= agent(mu=lo).shaded("interactive")


def test_overspending_raises_and_underspending_lowers_the_multiplier():
    a = agent(mu=1.0)
    before = a.mu
    a.observe(a.target(10.0) * 2, 10.0)
    assert a.mu > before
    before = a.mu
    a.observe(0.0, 10.0)
    assert a.mu < before
