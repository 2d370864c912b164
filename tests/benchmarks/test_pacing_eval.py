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


def test_the_diagnosis_counts_the_requests_the_reserve_bid_0():
    # As above: the first request takes the whole dollar as its worst case (2 $/s x 0.5 s), so
    # the reserve (factor 1 x $1 in flight) leaves nothing for the second, worth 5 $/s: bid 0 by
    # the safety rule, not by the strategy. The update records it beside the reserve, $1.
    f = focal("mu=0", 1.0)
    f.bid("r1", 5.0, 0.5)
    f.bid("r2", 5.0, 0.5)
    assert (f.out.forced_zero, f.out.forced_zero_value, f.out.value) == (1, 5.0, 10.0)
    f.tick(1.0, 1.0, True)
    assert f.out.curve == [(1.0, 0.0, 0.0, 1.0, 1)]  # t, paid, mu, reserve, bid 0 since
    f.tick(2.0, 1.0, True)
    assert f.out.curve[-1][4] == 0  # counted per update
    zero = focal("zero", 1.0)
    zero.bid("r", 5.0, 0.5)
    assert zero.out.forced_zero == 0  # bidding 0 by choice is not the reserve's doing


def test_shading_and_the_baselines():
    assert focal("mu=3", 100.0).bid("r", 2.0, 1.0) == pytest.approx(0.5)  # value / (1 + mu)
    assert focal("zero", 100.0).bid("r", 2.0, 1.0) == 0.0
    assert focal("free", math.inf).bid("r", 2.0, 1.0) == 2.0


def test_throttling_bids_the_full_value_or_nothing_one_request_in_1_plus_mu():
    # The throttling design at mu = 3: each request bids its whole value, 2 $/s, with
    # probability 1 / 4, else 0; the draw is the request's own (the same for a seed).
    spec = pacing.Spec(0, "A", "pacing", 100.0, 0.5, design="throttle", gain=0.0)

    def throttled() -> pacing._Focal:
        f = pacing._Focal(spec, pacing.Setup(period_s=10.0, updates=10), 1.0, 2.0)
        f.agent.mu = 3.0
        f.exposure.factor = 0.0  # nothing reserved for the requests in flight
        return f

    f = throttled()
    bids = [f.bid(f"r{k}", 2.0, 1.0) for k in range(4000)]
    assert set(bids) == {0.0, 2.0}
    assert bids.count(2.0) / len(bids) == pytest.approx(0.25, abs=0.02)
    assert [throttled().bid(f"r{k}", 2.0, 1.0) for k in range(50)] == bids[:50]


def test_the_interval_by_hand():
    # 1, 2, 3: mean 2, sd 1, t(0.975, 2) = 4.303: 2 -/+ 4.303 / sqrt(3).
    mean, lo, hi = pacing.interval([1.0, 2.0, 3.0])
    half = 4.303 / math.sqrt(3)
    assert (mean, lo, hi) == (2.0, pytest.approx(2 - half), pytest.approx(2 + half))
    assert pacing.t975(15) == 2.131 and pacing.t975(40) == 1.96
    # One value has a mean and no interval; none has neither (a short period can leave a
    # strategy no seed to compare), rather than an error ending the run.
    assert pacing.interval([5.0])[0] == 5.0 and math.isnan(pacing.interval([5.0])[1])
    assert all(math.isnan(x) for x in pacing.interval([]))


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


def target_focal(strategy: str, cap: float) -> pacing._Focal:
    spec = pacing.Spec(0, "A", strategy, 100.0, 0.5, target=(0.5, 0.75))
    return pacing._Focal(spec, pacing.Setup(period_s=10.0, updates=10), 1.0, 8.0, cap)


def history(high_wait: float) -> list:
    """30 requests bid 2 $/s and waited 0.01..0.30 s, 30 bid 0.1 and waited ``high_wait``
    + 0.01..0.30 s: groups {2 x 30}, {0.1 x 30}."""
    waits = [0.01 * k for k in range(1, 31)]
    fast = [pacing.Waited(bid=2.0, ttft_s=w) for w in waits]
    return fast + [pacing.Waited(bid=0.1, ttft_s=high_wait + w) for w in waits]


def test_a_latency_target_is_worth_the_quote_under_the_cap():
    # Target 0.5 s at p 0.75: a group of 30 is judged by its wait at 0.75 + 2 sqrt(0.75 x 0.25 /
    # 30) = 0.908, the 28th (ceil(27.2)). Low bids waited 1.01..1.30 s (28th: 1.28 > 0.5), high
    # bids 0.01..0.30 (0.28): the quote is the high group's median
    # bid, 2. Under a cap of 3 the class is worth 2; mu = 1 (set by hand) bids 1.
    f = target_focal("target", 3.0)
    f.requote(history(1.0))
    assert f.out.quotes == [2.0] and f.worth == 2.0
    f.agent.mu = 1.0
    assert f.bid("r", 0.01, 1.0) == pytest.approx(1.0)  # the request's own value is not read
    # When the low bids waited 0.01..0.30 s too, both groups meet it: the quote is the lower
    # group's median, 0.1. A cap of 1.5 bounds a quote of 2; no quote at all is the cap.
    f.requote(history(0.0))
    assert f.worth == pytest.approx(0.1)
    capped = target_focal("target", 1.5)
    capped.requote(history(1.0))
    assert capped.worth == 1.5
    capped.requote([])  # too short a history: nothing quoted
    assert math.isnan(capped.out.quotes[-1]) and capped.worth == 1.5


def test_the_fixed_quote_is_the_first_one_found():
    # Nothing quoted yet: the cap (3). Then 2, held: a later history quoting 0.1 is not read.
    f = target_focal("quote0", 3.0)
    f.requote([])
    assert f.bid("r0", 0.01, 1.0) == 3.0
    f.requote(history(1.0))
    f.requote(history(0.0))
    assert f.out.quotes[1:] == [2.0] and f.bid("r", 0.01, 1.0) == 2.0  # mu 0: the quote


def test_the_target_strategies_stay_within_the_budget(monkeypatch):
    monkeypatch.setattr(pacing, "WARMUP_S", 10.0)
    setup = pacing.Setup(period_s=2.0, updates=20)
    free = pacing.run(pacing.Spec(3, "A", "free", target=(0.3, 0.75)), setup)
    for strategy in pacing.TARGET_STRATEGIES:
        spec = pacing.Spec(
            3, "A", strategy, free.paid * 0.5, 0.5, target=(0.3, 0.75), fixed_bid=0.5
        )
        out = pacing.run(spec, setup)
        assert out.paid <= spec.budget * (1 + 1e-12) and out.settled == out.requests
        assert 0 <= out.met <= out.requests and out.quotes
