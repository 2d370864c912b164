"""The hold horizon (``accounts.rules.hold_horizon_s``) and its renewal from a market's
recent charges (``market.holds.hold_horizon_renew``), against hand-worked quantiles."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accounts.rules import (
    HOLD_HORIZON_FLOOR_S,
    HOLD_HORIZON_PRIOR_S,
    HOLD_MIN_SAMPLES,
    hold_horizon_s,
    priority_hold,
)
from accounts.services import request_open, request_settle
from market.holds import hold_horizon_renew
from tests.accounts.factories import market_create, priority_charge, tenant_create

D = Decimal


def test_the_horizon_is_the_99th_percentile_within_the_floor_and_max_wait() -> None:
    # 100 values 0.1, 0.2, ..., 10.0 s: the nearest-rank 99th percentile is the 99th, 9.9 s;
    # with a margin of 2 (the benchmark's alternative), 19.8 s.
    seconds = [i / 10 for i in range(1, 101)]
    assert hold_horizon_s(seconds, max_wait_s=60.0) == pytest.approx(9.9)
    assert hold_horizon_s(seconds, max_wait_s=60.0, margin=2.0) == pytest.approx(19.8)
    assert hold_horizon_s(seconds, max_wait_s=5.0) == 5.0  # never past what was consented
    # All tiny (0.001 s): the floor, 0.05 s.
    assert hold_horizon_s([0.001] * 100, max_wait_s=60.0) == HOLD_HORIZON_FLOOR_S == 0.05
    # Too few to say: the prior, 1 s, whatever they say.
    few = [30.0] * (HOLD_MIN_SAMPLES - 1)
    assert hold_horizon_s(few, max_wait_s=60.0) == HOLD_HORIZON_PRIOR_S == 1.0
    assert hold_horizon_s([*few, 30.0], max_wait_s=100.0) == 30.0


def test_the_priority_hold_is_the_bid_over_the_horizon_at_most_the_cap() -> None:
    assert priority_hold(effective_bid=D("0.1"), horizon_s=2.5, consent_cap=D("6")) == D("0.25")
    assert priority_hold(effective_bid=D("0.1"), horizon_s=90.0, consent_cap=D("6")) == D("6")
    assert priority_hold(effective_bid=D(0), horizon_s=2.5, consent_cap=D(0)) == D(0)


@pytest.mark.django_db
def test_a_markets_horizon_is_renewed_from_its_charges_per_dollar_of_bid() -> None:
    market, tenant = market_create("hz"), tenant_create("hz")
    assert market.hold_horizon_s == 1.0
    # 40 requests at bid 0.5 $/s, charged 0.05 x k dollars (k = 1..40): 0.1 x k seconds of bid.
    # The 99th percentile of 40 values is the 40th (ceil(0.99 x 40) = 40): 4 s.
    # A request of bid 0 (no effective bid) tells nothing and is left out.
    for k in range(1, 42):
        rid = f"hz-{k}"
        bid = 0.5 if k <= 40 else 0.0
        request_open(request_id=rid, tenant=tenant, api_key=None, market=market, bid=bid,
                     hold_amount="1")  # fmt: skip
        request_settle(request_id=rid, prompt_tokens=0, cached_tokens=0, completion_tokens=0,
                       priority=priority_charge(0.05 * k if k <= 40 else 0.0, bid=bid))  # fmt: skip
    assert hold_horizon_renew(market=market) == pytest.approx(4.0)
    market.refresh_from_db()
    assert market.hold_horizon_s == pytest.approx(4.0)
