"""The autobidder's settings, bids and pacing steps, with hand-worked numbers."""

import math
from datetime import timedelta
from decimal import Decimal

import pytest

from accounts.models import Autobidder, BidSource, ChargeKind, LedgerEntry, Request
from accounts.services import request_open
from accounts.services.autobidder import (
    LatencyTarget,
    autobid,
    autobid_in_flight,
    autobidder_configure,
    autobidder_step,
)
from accounts.windows import window_for
from tests.accounts.factories import NOW, market_create, tenant_create

pytestmark = pytest.mark.django_db


def charged(tenant, market, rid, amount, *, at, source=BidSource.AUTOBID, cap=None, detail=None):
    """A served request with a priority charge of ``amount`` dollars at ``at``, counted by the
    autobidder as settlement counts it (autobid requests only)."""
    req = Request.objects.create(
        request_id=rid,
        tenant=tenant,
        market=market,
        created_at=at,
        bid_source=source,
        priority_cap=cap,
    )
    LedgerEntry.objects.create(
        request=req,
        kind=ChargeKind.PRIORITY,
        tenant=tenant,
        market=market,
        amount=Decimal(amount),
        created_at=at,
        detail=detail or {},
    )
    auto = Autobidder.objects.filter(tenant=tenant).first()
    if auto is not None and source == BidSource.AUTOBID:
        start = window_for(period=auto.period, now=at).start
        if auto.spent_start > start:  # configured at the real clock, ahead of the tests' NOW
            auto.spent_start, auto.spent_in_window = start, Decimal(0)
        auto.charge_counted(amount=Decimal(amount), at=at)
        auto.save()


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
    # Budget $8.64 a day; $8.63 already spent today leaves $0.01. With no history the exposure
    # factor is 1 (the worst case): with a 10 s wait bound the bid may be at most 0.001 $/s
    # (0.001 x 10 = 0.01). Yesterday's spend does not count.
    market = market_create()
    charged(acme, market, "r0", "100", at=NOW - timedelta(days=1))
    charged(acme, market, "r1", "8.63", at=NOW - timedelta(hours=1))
    got = autobid(tenant=acme, request_class="interactive", now=NOW)
    assert got.bid == Decimal("0.001")
    assert got.worst_case == Decimal("0.01")


def test_requests_in_flight_are_reserved_for(acme):
    # Exposure factor 0.1: each request in flight reserves a tenth of its worst case. Two in
    # flight with worst cases 0.5 + 0.3 reserve 0.08 of the $8.64: 8.56 is left for a new one,
    # whose bid costs 0.1 x 10 s = 1 per $/s at most: 8.56 $/s, the value 0.05 fits. With
    # $8.60 spent, 0.04 - 0.08 < 0: it bids nothing until those settle.
    Autobidder.objects.filter(tenant=acme).update(exposure_factor=0.1)
    market = market_create()
    for rid, cap in (("f1", "0.5"), ("f2", "0.3")):
        request_open(
            request_id=rid,
            tenant=acme,
            api_key=None,
            market=market,
            bid="0.05",
            hold_amount=cap,
            priority_cap=Decimal(cap),
            bid_source=BidSource.AUTOBID,
            now=NOW,
        )
    assert autobid_in_flight(tenant_id=acme.pk) == Decimal("0.8")
    assert autobid(tenant=acme, request_class="interactive", now=NOW).bid == Decimal("0.05")
    charged(acme, market, "r1", "8.60", at=NOW - timedelta(hours=1))
    assert autobid(tenant=acme, request_class="interactive", now=NOW).bid == 0
    # Once f1's charge settles it is no longer in flight: 0.04 - 0.03 = 0.01 left, 0.01 $/s.
    LedgerEntry.objects.create(
        request_id="f1",
        kind=ChargeKind.PRIORITY,
        tenant=acme,
        market=market,
        amount=Decimal(0),
        created_at=NOW,
    )
    assert autobid_in_flight(tenant_id=acme.pk) == Decimal("0.3")
    assert autobid(tenant=acme, request_class="interactive", now=NOW).bid == Decimal("0.01")


def test_only_autobid_spend_counts(acme):
    market = market_create()
    charged(acme, market, "r1", "8.63", at=NOW - timedelta(hours=1), source=BidSource.EXPLICIT)
    assert autobid(tenant=acme, request_class="interactive", now=NOW).bid == Decimal("0.05")


def test_a_step_moves_mu_by_hand():
    # Budget $86.40 a day, the step runs at 12:00 UTC over the last 60 s: 43,260 s of the day
    # are left when it starts (from 11:59), nothing spent, so the target is
    # 86.40 x 60 / 43,260 = 0.11983...  Spent 0.2396... twice the target: gradient 1. A day has
    # 1,440 steps of 60 s: eta = 0.5 / sqrt(1440), and log(1 + mu) = eta.
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
    mu = math.expm1(0.5 / math.sqrt(1440))
    assert step.mu == pytest.approx(mu, abs=1e-9)
    assert step.target == pytest.approx(target, abs=Decimal("1E-9"))
    assert autobid(tenant=tenant, request_class="interactive", now=noon).bid == pytest.approx(
        Decimal("0.5") / Decimal(repr(1 + mu)), abs=Decimal("1E-9")
    )
    # A quiet minute after that: gradient -1, mu back to 0 (up to the nano-dollar rounding).
    step = autobidder_step(tenant=tenant, interval_s=60, now=noon + timedelta(seconds=60))
    assert step.mu == pytest.approx(0.0, abs=1e-6)


def test_a_step_renews_the_exposure_factor_and_reports_what_was_given_away():
    # 40 settled autobid requests with worst case $1 asked 0.01 .. 0.39 and 0.45: the 99%
    # quantile is the 40th, 0.45. That one was cut by the autobidder's budget from 0.45 to 0.25:
    # 0.20 given away (the factor reads what was asked, 0.45, not what was paid).
    tenant = tenant_create("initech")
    autobidder_configure(
        tenant=tenant, enabled=True, budget="100", period="day", values={"interactive": "0.5"}
    )
    market = market_create()
    for k in range(1, 41):
        amount, detail = f"{k / 100:.2f}", {}
        if k == 40:
            amount = "0.25"
            detail = {"capped_by": "autobidder_budget", "capped_at": "0.25", "uncapped": "0.45"}
        at = NOW - timedelta(seconds=100 - k)
        charged(tenant, market, f"e{k}", amount, at=at, cap=Decimal(1), detail=detail)
    step = autobidder_step(tenant=tenant, interval_s=60, now=NOW)
    assert step.exposure_factor == pytest.approx(0.45)
    assert step.uncollected == Decimal("0.20")
    assert Autobidder.objects.get(tenant=tenant).exposure_factor == pytest.approx(0.45)


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


# A request class with a latency target instead of a value (issue 33, item 3).
TARGET = {"ttft_s": 2, "p": 0.9}


@pytest.fixture
def initech():
    tenant = tenant_create("initech")
    autobidder_configure(
        tenant=tenant,
        enabled=True,
        budget="8.64",
        period="day",
        values={"chat": TARGET, "background": "0.001"},
        max_wait_s=10.0,
    )
    return tenant


def test_a_target_class_bids_the_quote_shaded_by_mu(initech):
    # Stored as given (floats), beside the value class. mu = 1.5: the quote 0.006 $/s is bid
    # as 0.006 / 2.5 = 0.0024, the value 0.001 as 0.0004, both within the budget's bound
    # (nothing spent: $8.64 / 10 s = 0.864 $/s).
    auto = Autobidder.objects.get(tenant=initech)
    assert auto.values == {"chat": {"ttft_s": 2.0, "p": 0.9}, "background": "0.001000000"}
    Autobidder.objects.filter(tenant=initech).update(mu=1.5)
    asked = []

    def quoted(target: LatencyTarget) -> Decimal:
        asked.append(target)
        return Decimal("0.006")

    got = autobid(tenant=initech, request_class="chat", now=NOW, quoted=quoted)
    assert got.bid == Decimal("0.0024")
    assert got.worst_case == Decimal("0.024")  # x max_wait_s 10
    assert asked == [LatencyTarget(ttft_s=2.0, p=0.9)]
    value_bid = autobid(tenant=initech, request_class="background", now=NOW, quoted=quoted)
    assert value_bid.bid == Decimal("0.0004")
    assert len(asked) == 1  # a value class asks for no quote


def test_a_target_class_bids_within_the_budgets_bound(initech):
    # $8.63 spent of $8.64 leaves $0.01; factor 1 and a 10 s bound allow 0.001 $/s at most,
    # under the quote 0.006 / (1 + 0).
    charged(initech, market_create(), "r1", "8.63", at=NOW - timedelta(hours=1))
    got = autobid(tenant=initech, request_class="chat", now=NOW, quoted=lambda _t: Decimal("0.006"))
    assert got.bid == Decimal("0.001")


def test_a_target_class_needs_a_quote(initech):
    with pytest.raises(ValueError, match="latency target"):
        autobid(tenant=initech, request_class="chat", now=NOW)


@pytest.mark.parametrize(
    "target, words",
    [
        ({"ttft_s": 0, "p": 0.9}, "ttft_s must be > 0"),
        ({"ttft_s": -1.5, "p": 0.9}, "ttft_s must be > 0"),
        ({"ttft_s": float("inf"), "p": 0.9}, "ttft_s must be > 0"),
        ({"ttft_s": 2, "p": 1}, "p must lie strictly between 0 and 1"),
        ({"ttft_s": 2, "p": 0}, "p must lie strictly between 0 and 1"),
        ({"ttft_s": 2, "p": 1.5}, "p must lie strictly between 0 and 1"),
        ({"ttft_s": "2", "p": 0.9}, "ttft_s must be a number"),
        ({"ttft_s": 2, "p": True}, "p must be a number"),
        ({"ttft_s": 2}, "a latency target is .* exactly, got the keys \\['ttft_s'\\]"),
        ({"ttft_s": 2, "p": 0.9, "bid": "0.1"}, "a latency target is .* exactly"),
    ],
)
def test_a_malformed_target_is_refused_and_changes_nothing(initech, target, words):
    with pytest.raises(ValueError, match=f"request class 'chat': {words}"):
        autobidder_configure(tenant=initech, enabled=True, budget="1", values={"chat": target})
    auto = Autobidder.objects.get(tenant=initech)
    assert (auto.budget, auto.values["chat"]) == (Decimal("8.64"), {"ttft_s": 2.0, "p": 0.9})


def test_a_step_bounds_mu_by_the_cap_for_a_target_class():
    # Only a target class: the most it is worth is the tenant's priority_bid_cap, 2.16 $/s.
    # One autobid request since midnight at 12:00 (43,200 s): 1 / 43,200 a second; the budget's
    # rate is 86.40 / 86,400 = 0.001 $/s; max_wait_s 60. mu_max = 2.16 x 60 / 43,200 / 0.001 - 1
    # = 2. Started at mu 5 (clipped to 2), a minute with no spend (gradient -1) and eta 0.5 over
    # 1,440 steps: log(1 + mu) = log 3 - 0.5 / sqrt(1440).
    tenant = tenant_create("umbrella")
    tenant.priority_bid_cap = Decimal("2.16")
    tenant.save()
    autobidder_configure(
        tenant=tenant, enabled=True, budget="86.40", period="day", values={"chat": TARGET}, eta=0.5
    )
    Autobidder.objects.filter(tenant=tenant).update(mu=5.0)
    noon = NOW.replace(hour=12, minute=0, second=0)
    charged(tenant, market_create(), "a", "0.01", at=noon - timedelta(hours=2))
    step = autobidder_step(tenant=tenant, interval_s=60, now=noon)
    assert step.mu == pytest.approx(3 * math.exp(-0.5 / math.sqrt(1440)) - 1, rel=1e-9)
