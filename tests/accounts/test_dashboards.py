"""Dashboard selectors: spend per hour, charges by market, top priority charges; each scoped
to one tenant."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from accounts.selectors import charges_by_market, spend_per_hour, top_requests_by_priority
from tests.accounts.factories import NOW, market_create, spend, tenant_create

pytestmark = pytest.mark.django_db

D = Decimal


@pytest.fixture
def data():
    acme, globex = tenant_create("acme"), tenant_create("globex")
    small, big = market_create("test-llm"), market_create("big-llm")
    hour = NOW.replace(minute=0)  # 15:00 UTC
    spend(tenant=acme, market=small, request_id="a1", charge=0.25, at=hour + timedelta(minutes=5))
    spend(tenant=acme, market=big, request_id="a2", charge=0.5, at=hour + timedelta(minutes=20))
    spend(tenant=acme, market=small, request_id="a3", charge=0.125, at=hour - timedelta(hours=2))
    spend(tenant=acme, market=small, request_id="old", charge=4.0, at=hour - timedelta(hours=30))
    spend(tenant=globex, market=small, request_id="g1", charge=9.0, at=hour)
    return acme, globex


def test_spend_per_hour_is_zero_filled_and_scoped(data) -> None:
    acme, globex = data
    hours = spend_per_hour(tenant=acme, hours=4, now=NOW)
    assert [h.hour for h in hours] == [
        datetime(2026, 11, 18, h, tzinfo=UTC) for h in (12, 13, 14, 15)
    ]
    # 15:00 holds a1 + a2 = 0.75; 13:00 holds a3 = 0.125; globex's 9 is not acme's.
    assert [h.amount for h in hours] == [D(0), D("0.125"), D(0), D("0.75")]
    assert [h.amount for h in spend_per_hour(tenant=globex, hours=1, now=NOW)] == [D(9)]
    with pytest.raises(ValueError):
        spend_per_hour(tenant=acme, hours=0, now=NOW)


def test_charges_by_market(data) -> None:
    acme, _ = data
    rows = charges_by_market(tenant=acme, since=NOW - timedelta(hours=24), until=NOW)
    assert [(r.market, r.requests, r.priority, r.tokens, r.total) for r in rows] == [
        ("big-llm", 1, D("0.5"), D(0), D("0.5")),
        ("test-llm", 2, D("0.375"), D(0), D("0.375")),  # a1 0.25 + a3 0.125
    ]


def test_top_requests_by_priority(data) -> None:
    acme, _ = data
    top = top_requests_by_priority(tenant=acme, since=NOW - timedelta(hours=24), limit=2)
    assert [(t.request_id, t.amount, t.market) for t in top] == [
        ("a2", D("0.5"), "big-llm"),
        ("a1", D("0.25"), "test-llm"),
    ]
    everything = top_requests_by_priority(tenant=acme, since=NOW - timedelta(days=2))
    assert [t.request_id for t in everything] == ["old", "a2", "a1", "a3"]
