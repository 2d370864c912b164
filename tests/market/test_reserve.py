"""Markets and their reserve prices: validated, audited, set in one transaction."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from market.models import DEFAULT_POLICY, Market, ReserveChange
from market.services import DEMO_MARKET, market_demo_seed, market_reserve_set
from mechanism import POLICIES

pytestmark = pytest.mark.django_db

AT = datetime(2026, 11, 18, 12, tzinfo=UTC)


@pytest.fixture
def market() -> Market:
    return Market.objects.create(slug="m", name="M", served_model="org/m", reserve=Decimal("0.01"))


def test_setting_the_reserve_writes_the_value_and_the_audit_row(market) -> None:
    operator = get_user_model().objects.create_user("op", is_staff=True)
    change = market_reserve_set(market=market, reserve="0.025", user=operator, now=AT)
    market.refresh_from_db()
    assert market.reserve == Decimal("0.025")
    assert (change.market, change.changed_by, change.old, change.new, change.at) == (
        market,
        operator,
        Decimal("0.01"),
        Decimal("0.025"),
        AT,
    )


def test_setting_the_same_reserve_writes_nothing(market) -> None:
    assert market_reserve_set(market=market, reserve="0.010000000", user=None) is None
    assert not ReserveChange.objects.exists()


@pytest.mark.parametrize("bad", ["-0.01", "NaN", "inf", "0.0000000001", 0.5, "abc", Decimal("-1")])
def test_bad_reserves_are_refused_and_nothing_changes(market, bad) -> None:
    with pytest.raises(ValueError):
        market_reserve_set(market=market, reserve=bad, user=None)
    market.refresh_from_db()
    assert market.reserve == Decimal("0.01")
    assert not ReserveChange.objects.exists()


def test_the_default_policy_is_a_registered_one() -> None:
    assert DEFAULT_POLICY == "dfs-auction-kv-split" and DEFAULT_POLICY in POLICIES
    assert Market().policy == DEFAULT_POLICY


def test_the_demo_market_is_seeded_once() -> None:
    first = market_demo_seed()
    market_reserve_set(market=first, reserve="0.5", user=None)
    again = market_demo_seed()
    assert again.pk == first.pk and Market.objects.count() == 1
    again.refresh_from_db()
    assert again.reserve == Decimal("0.5")  # an operator's change is kept
    assert first.slug == DEMO_MARKET.slug
