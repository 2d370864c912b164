"""The pacing agent: the update rule by hand, and its bounds as properties."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from market.mechanism.pacing import NaiveAgent, PacingAgent


def agent(**kw):
    base = {"budget": 100.0, "period_s": 1000.0, "values": {"interactive": 2.0, "batch": 0.5}}
    return PacingAgent(**{**base, **kw})


def test_a_fresh_agent_bids_its_values():
    a = agent()
    assert a.bid("interactive", max_wait_s=1.0) == 2.0
    assert a.bid("batch", max_wait_s=1.0) == 0.5


def test_update_rule_by_hand():
    # Budget 100 over 1000 s: the first 10 s should spend 100 x 10/1000 = 1 dollar.
    # Spending 1.5: gradient 1.5/1 - 1 = 0.5, mu = 0 + 0.5 x 0.5 = 0.25; bids / 1.25.
    a = agent(eta=0.5)
    assert a.observe(1.5, 10.0) == pytest.approx(0.25)
    assert a.bid("interactive", max_wait_s=1.0) == pytest.approx(2.0 / 1.25)
    # Next 10 s: 98.5 left over 990 s -> target 98.5 x 10/990 = 0.99495; spending 0: gradient -1,
    # mu = 0.25 - 0.5 = -0.25 -> projected to 0.
    assert a.observe(0.0, 10.0) == 0.0
    assert a.spent == pytest.approx(1.5) and a.elapsed_s == pytest.approx(20.0)


def test_mu_is_clipped_at_mu_max():
    a = agent(eta=5.0, mu_max=3.0)
    a.observe(50.0, 10.0)  # 50x the target
    assert a.mu == 3.0
    assert a.bid("interactive", max_wait_s=1.0) == pytest.approx(2.0 / 4.0)


def test_the_budget_bound_caps_the_bid():
    # 100 dollars left, planned wait at most 80 s: any bid above 1.25 $/s could cost more than
    # what is left (charge <= bid x wait).
    a = agent()
    assert a.bid("interactive", max_wait_s=80.0) == pytest.approx(1.25)
    a.observe(100.0, 10.0)
    assert a.bid("interactive", max_wait_s=1.0) == 0.0  # nothing left: no priority


def test_bad_configuration_and_classes():
    with pytest.raises(ValueError, match="budget"):
        agent(budget=-1.0)
    with pytest.raises(ValueError, match="period_s"):
        agent(period_s=0.0)
    with pytest.raises(ValueError, match="value of class 'x'"):
        agent(values={"x": float("nan")})
    with pytest.raises(ValueError, match="'other'"):
        agent().bid("other", max_wait_s=1.0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 50), st.floats(0.1, 100)), max_size=40),
    st.floats(0.01, 10),
    st.floats(0.1, 1000),
)
def test_bounds_hold_for_any_spending(steps, eta, max_wait):
    a = agent(eta=eta)
    for spent, interval in steps:
        a.observe(spent, interval)
        assert 0.0 <= a.mu <= a.mu_max
        for cls, value in a.values.items():
            b = a.bid(cls, max_wait_s=max_wait)
            assert 0.0 <= b <= value
            assert b * max_wait <= a.remaining + 1e-9


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 5), st.floats(0, 5))
def test_a_larger_multiplier_never_bids_more(mu1, mu2):
    lo, hi = sorted((mu1, mu2))
    assert agent(mu=hi).bid("interactive", max_wait_s=1.0) <= agent(mu=lo).bid(
        "interactive", max_wait_s=1.0
    )


def test_overspending_raises_and_underspending_lowers_the_multiplier():
    a = agent(mu=1.0)
    before = a.mu
    a.observe(a.target(10.0) * 2, 10.0)
    assert a.mu > before
    before = a.mu
    a.observe(0.0, 10.0)
    assert a.mu < before


def test_naive_agent_bids_full_value_until_broke():
    n = NaiveAgent(budget=10.0, values={"interactive": 2.0})
    assert n.bid("interactive", max_wait_s=1.0) == 2.0
    n.observe(9.0, 1.0)
    assert n.bid("interactive", max_wait_s=1.0) == pytest.approx(1.0)
    n.observe(1.0, 1.0)
    assert n.bid("interactive", max_wait_s=1.0) == 0.0
