"""The guards on a market's controls: the confirmation rule, a new reserve's count against the
book waiting now, the reserve's ceiling, and the audit of policy and ceiling changes."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from market.controls import ReserveImpact, reserve_impact, reserve_needs_confirmation
from market.models import ControlChange, Market, ReserveChange
from market.services import (
    ReserveAboveCeiling,
    market_policy_set,
    market_reserve_max_set,
    market_reserve_set,
)

AT = datetime(2026, 12, 3, 12, tzinfo=UTC)
D = Decimal


@pytest.mark.parametrize(
    ("old", "new", "asks"),
    [
        ("0.001", "0.01", False),  # exactly 10x: allowed as it is
        ("0.001", "0.010000001", True),  # beyond 10x
        ("0.001", "1000000", True),  # the incident
        ("0.001", "0.0001", False),  # exactly a tenth
        ("0.001", "0.000099999", True),
        ("0.001", "0", True),  # no reserve at all, from one
        ("0", "0.000000001", True),  # from none, any reserve is beyond every factor
        ("0", "0", False),
        ("0.5", "0.5", False),
    ],
)
def test_a_reserve_beyond_ten_times_either_way_asks_first(old, new, asks) -> None:
    assert reserve_needs_confirmation(D(old), D(new)) is asks


def test_the_count_against_the_book_is_bids_strictly_below_the_reserve() -> None:
    # One engine, bids 0 0.001 0.002 0.002 0.05; current reserve 0.002 (bids of 0.002 count).
    books = [([0.0, 0.001, 0.002, 0.002, 0.05], 5)]
    assert reserve_impact(books, reserve=0.003, current=0.002) == ReserveImpact(
        waiting=5, below=4, below_now=2, exact=True
    )
    lowered = reserve_impact(books, reserve=0.0005, current=0.002)
    assert (lowered.below, lowered.lose_priority, lowered.gain_priority) == (1, 0, 1)
    raised = reserve_impact(books, reserve=0.06, current=0.002)
    assert (raised.below, raised.lose_priority) == (5, 3)


def test_an_engine_that_sent_a_sample_of_its_bids_is_scaled_to_its_queue() -> None:
    # 4 sampled bids for a queue of 40: 1 of 4 below 0.01 stands for 10 of 40; exact no more.
    books = [([0.001, 0.02, 0.03, 0.04], 40), ([0.005], 1)]
    impact = reserve_impact(books, reserve=0.01, current=0.0)
    assert impact == ReserveImpact(waiting=41, below=11, below_now=0, exact=False)
    assert reserve_impact([], reserve=1.0, current=0.0) == ReserveImpact(0, 0, 0, True)


@pytest.fixture
def market() -> Market:
    return Market.objects.create(slug="m", name="M", served_model="org/m", reserve=D("0.01"))


@pytest.mark.django_db
def test_a_reserve_above_the_ceiling_is_refused_and_nothing_changes(market) -> None:
    assert market.reserve_max == D("1")  # the default ceiling, far above the demo's bids
    with pytest.raises(ReserveAboveCeiling) as refused:
        market_reserve_set(market=market, reserve="1.000000001", user=None)
    assert (refused.value.reserve, refused.value.ceiling) == (D("1.000000001"), D("1"))
    assert market_reserve_set(market=market, reserve="1", user=None) is not None  # at it: fine
    market.refresh_from_db()
    assert market.reserve == D("1") and ReserveChange.objects.count() == 1


@pytest.mark.django_db
def test_the_ceiling_is_audited_and_never_below_the_reserve_in_force(market) -> None:
    operator = get_user_model().objects.create_user("op", is_staff=True)
    change = market_reserve_max_set(market=market, reserve_max="5", user=operator, now=AT)
    assert (change.control, change.old, change.new, change.changed_by, change.at) == (
        "reserve_max", "1.000000000", "5.000000000", operator, AT,
    )  # fmt: skip
    assert market_reserve_max_set(market=market, reserve_max="5.0", user=operator) is None
    with pytest.raises(ValueError, match="below the reserve in force"):
        market_reserve_max_set(market=market, reserve_max="0.009", user=operator)
    for bad in ["-1", "abc", "2000000", "0.0000000001"]:
        with pytest.raises(ValueError):
            market_reserve_max_set(market=market, reserve_max=bad, user=operator)
    market.refresh_from_db()
    assert market.reserve_max == D("5") and ControlChange.objects.count() == 1


@pytest.mark.django_db
def test_a_policy_switch_is_audited_with_who_when_old_and_new(market) -> None:
    operator = get_user_model().objects.create_user("op", is_staff=True)
    assert market_policy_set(market=market, policy="lpm", user=operator, now=AT) == (
        "dfs-auction-kv-split"
    )
    assert market_policy_set(market=market, policy="lpm", user=operator) is None  # no change
    market_policy_set(market=market, policy="dfs-auction-density", user=None, now=AT)
    rows = [(c.control, c.old, c.new, c.changed_by, c.at) for c in ControlChange.objects.all()]
    assert rows == [  # newest first
        ("policy", "lpm", "dfs-auction-density", None, AT),
        ("policy", "dfs-auction-kv-split", "lpm", operator, AT),
    ]
    with pytest.raises(ValueError):
        market_policy_set(market=market, policy="cheapest", user=operator)
    assert ControlChange.objects.count() == 2
