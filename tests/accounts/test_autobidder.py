"""The autobidder's settings, bids and pacing steps, with hand-worked numbers."""

from datetime import timedelta
from decimal import Decimal

import pytest

from accounts.models import BidSource, ChargeKind, LedgerEntry, Request
from accounts.services.autobidder import autobid, autobidder_configure, autobidder_step
from tests.accounts.factories import NOW, market_create, tenant_create

pytestmark = pytest.mark.django_db


def charged(tenant, market, rid, amount, *, at, source=BidSource.AUTOBID):
    """A served autobid request with a priority charge of ``amount`` dollars at ``at``."""
    req = Request.objects.create(
        request_id=rid, tenant=tenant, market=market, created_at=at, bid_source=source
    )
    LedgerEntry.objects.create(
        request=req,
        kind=ChargeKind.PRIORITY,
        tenant=tenant,
        market=market,
        amount=Decimal(amount),
        created_at=at,
        detail={},
    )


@pytest.fixture
def acme():
    tenant = tenant_create("acme")
    autobidder_configure(
        tenant=tenant,
        enabled=True,
        budget="8.64",
        period="day",
        values={"interactive": "0.05", "background": "0.001"},
        max_wait_s=10.0,
        eta=0.5,
    )
    return tenant


def test_a_fresh_autobidder_bids_its_values(acme):
    assert autobid(tenant=acme, request_class="interactive", now=NOW).bid == Decimal("0.05")
    assert autobid(tenant=acme, request_class="background", now=NOW).bid == Decimal("0.001")
    assert autobid(tenant=acme, request_class="unknown", now=NOW) is None


def test_disabled_autobidder_does_not_bid(acme):
    autobidder_configure(tenant=acme, enabled=False, budget="1", values={"interactive": "1"})
    assert autobid(tenant=acme, request_class="interactive", now=NOW) is None


def test_the_budget_bound_caps_the_bid(acme):
    # Budget $8.64 a day; $8.63 already spent today leaves $0.01: with a 10 s wait bound the bid
    # may be at most 0.001 $/s (0.001 x 10 = 0.01).  Yesterday's spend does not count.
    market = market_create()
    charged(acme, market, "r1", "8.63", at=NOW - timedelta(hours=1))
    charged(acme, market, "r0", "100", at=NOW - timedelta(days=1))
    got = autobid(tenant=acme, request_class="interactive", now=NOW)
    assert got.bid == Decimal("0.001")
    assert got.worst_case == Decimal("0.01")


def test_only_autobid_spend_counts(acme):
    market = market_create()
    charged(acme, market, "r1", "8.63", at=NOW - timedelta(hours=1), source=BidSource.EXPLICIT)
    assert autobid(tenant=acme, request_class="interactive", now=NOW).bid == Decimal("0.05")


def test_a_step_moves_mu_by_hand():
    # Budget $86.40 a day, the step runs at 12:00 UTC over the last 60 s: 43,260 s of the day
    # are left when it starts (from 11:59), nothing spent, so the target is
    # 86.40 x 60 / 43,260 = 0.11983...  Spent 0.2396... twice the target: gradient 1, mu = 0.5.
    tenant = tenant_create("globex")
    autobidder_configure(
        tenant=tenant,
        enabled=True,
        budget="86.40",
        period="day",
        values={"interactive": "0.5"},
        eta=0.5,
    )
    noon = NOW.replace(hour=12, minute=0, second=0)
    target = Decimal("86.40") * 60 / Decimal(43_260)
    market = market_create()
    charged(
        tenant,
        market,
        "a",
        str((2 * target).quantize(Decimal("1E-9"))),
        at=noon - timedelta(seconds=30),
    )
    step = autobidder_step(tenant=tenant, interval_s=60, now=noon)
    assert step.mu == pytest.approx(0.5, abs=1e-6)
    assert step.target == pytest.approx(target, abs=Decimal("1E-9"))
    assert autobid(tenant=tenant, request_class="interactive", now=noon).bid == pytest.approx(
        Decimal("0.5") / Decimal("1.5"), abs=Decimal("1E-9")
    )
    # A quiet minute after that: gradient -1, mu back to 0 (up to the nano-dollar rounding).
    step = autobidder_step(tenant=tenant, interval_s=60, now=noon + timedelta(seconds=60))
    assert step.mu == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"budget": "-1"}, "negative"),
        ({"budget": "0.0000000001"}, "decimal"),
        ({"period": "none"}, "period"),
        ({"values": {"x": "nan"}}, "finite"),
        ({"max_wait_s": 0}, "max_wait_s"),
        ({"values": {}}, "at least one"),
    ],
)
def test_bad_settings_are_refused(kwargs, word):
    tenant = tenant_create("bad")
    settings = {"tenant": tenant, "enabled": True, "budget": "1", "values": {"i": "0.1"}}
    with pytest.raises(ValueError, match=word):
        autobidder_configure(**{**settings, **kwargs})
