"""The automatic reserve on the real database: each step reads the priority waits of the
requests finished in the interval, moves the reserve by the hand-computed factor and audits the
move; a manual change turns it off; off by default it never moves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.services import request_open, request_settle
from market.models import ControlChange, Market, ReserveChange
from market.reserves import reserve_auto_step, reserves_auto_step
from market.services import market_alerts_set, market_auto_reserve_set, market_reserve_set
from market.tasks import reserves_auto_step as reserves_auto_step_task
from tests.accounts.factories import market_create, tenant_create

pytestmark = pytest.mark.django_db

D = Decimal
T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
INTERVAL_S = 10.0


@pytest.fixture
def market() -> Market:
    market = market_create("auto")
    Market.objects.filter(pk=market.pk).update(
        reserve=D("0.001"), auto_reserve=True, auto_reserve_target_s=2.0
    )
    market.refresh_from_db()
    return market


def served(market: Market, *, step: int, waits: list[float], bid: str) -> None:
    """Requests bidding ``bid`` $/s served in interval ``step`` (finishing in it), with these
    times to first token."""
    tenant = tenant_create(f"t{step}-{bid.replace('.', '')}")
    for i, wait in enumerate(waits):
        rid = f"{market.slug}-{step}-{bid}-{i}"
        finish = T0 + timedelta(seconds=INTERVAL_S * (step - 1) + 1 + i * 0.1)
        request_open(request_id=rid, tenant=tenant, api_key=None, market=market, bid=bid,
                     hold_amount="0.01", now=finish - timedelta(seconds=wait))  # fmt: skip
        request_settle(request_id=rid, prompt_tokens=0, cached_tokens=0, completion_tokens=0,
                       ttft_s=wait, e2e_s=wait, now=finish)  # fmt: skip


def step(market: Market, n: int) -> ReserveChange | None:
    return reserve_auto_step(market_id=market.pk, interval_s=INTERVAL_S, now=T0 + n * timedelta(
        seconds=INTERVAL_S))  # fmt: skip


def reserve_of(market: Market) -> Decimal:
    market.refresh_from_db()
    return market.reserve


def test_waits_above_the_target_raise_the_reserve_by_the_hand_computed_factors(market) -> None:
    # Interval 1: ten priority requests (0.01 $/s >= 0.001) waiting 1..10 s: p90 (nearest rank,
    # the 9th) = 9 s; (9 - 2) / 2 = 3.5, clamped to 1: x 9/8 -> 0.001125. Requests under the
    # reserve (0.0005 $/s) waiting 60 s do not count.
    served(market, step=1, waits=[float(k) for k in range(1, 11)], bid="0.01")
    served(market, step=1, waits=[60.0] * 5, bid="0.0005")
    assert step(market, 1).new == D("0.001125") == reserve_of(market)
    # Interval 2: waits of 4 s: (4 - 2) / 2 = 1: x 9/8 -> 0.001265625 (exact in 9 places).
    served(market, step=2, waits=[4.0] * 5, bid="0.01")
    assert step(market, 2).new == D("0.001265625") == reserve_of(market)
    # Interval 3: 3 s: 0.5: x 17/16 -> 0.0013447265625, rounded half to even at 9 places:
    # 0.001344727.
    served(market, step=3, waits=[3.0] * 5, bid="0.01")
    assert step(market, 3).new == D("0.001344727") == reserve_of(market)
    moves = list(ReserveChange.objects.filter(market=market).order_by("at"))
    assert [(c.old, c.new, c.automatic, c.changed_by, c.at) for c in moves] == [
        (D("0.001"), D("0.001125"), True, None, T0 + timedelta(seconds=10)),
        (D("0.001125"), D("0.001265625"), True, None, T0 + timedelta(seconds=20)),
        (D("0.001265625"), D("0.001344727"), True, None, T0 + timedelta(seconds=30)),
    ]


def test_waits_below_the_target_lower_it_and_no_evidence_keeps_it(market) -> None:
    # 1.5 s against 2 s: -0.25: x 31/32 -> 0.00096875.
    served(market, step=1, waits=[1.5] * 5, bid="0.01")
    assert step(market, 1).new == D("0.00096875")
    # Interval 2 served nothing: no evidence, no move, no audit row.
    assert step(market, 2) is None
    assert reserve_of(market) == D("0.00096875")
    # Interval 3 served only bids under the reserve: priority demand is under the target, one
    # full step down: x 7/8 = 0.00084765625 -> 0.000847656 at 9 places.
    served(market, step=3, waits=[30.0] * 3, bid="0.0005")
    assert step(market, 3).new == D("0.000847656") == reserve_of(market)
    assert ReserveChange.objects.filter(market=market, automatic=True).count() == 2


def test_the_reserve_never_passes_its_ceiling(market) -> None:
    Market.objects.filter(pk=market.pk).update(reserve_max=D("0.00105"))
    served(market, step=1, waits=[9.0] * 5, bid="0.01")
    assert step(market, 1).new == D("0.00105")  # x 9/8 would be 0.001125


def test_a_manual_change_turns_it_off(market) -> None:
    operator = get_user_model().objects.create_user("op", is_staff=True)
    market_reserve_set(market=market, reserve="0.002", user=operator, now=T0)
    market.refresh_from_db()
    assert market.auto_reserve is False
    off = ControlChange.objects.get(market=market, control=ControlChange.Control.AUTO_RESERVE)
    assert (off.old, off.new, off.changed_by) == ("on, p90 <= 2 s", "off", operator)
    served(market, step=1, waits=[9.0] * 5, bid="0.01")
    assert step(market, 1) is None
    assert reserve_of(market) == D("0.002")
    manual = ReserveChange.objects.get(market=market)
    assert (manual.automatic, manual.changed_by) == (False, operator)


def test_off_by_default_it_never_moves() -> None:
    market = market_create("manual")
    assert market.auto_reserve is False
    Market.objects.filter(pk=market.pk).update(reserve=D("0.001"))
    served(market, step=1, waits=[9.0] * 10, bid="0.01")
    served(market, step=2, waits=[], bid="0.01")
    for n in (1, 2, 3):
        assert step(market, n) is None
    assert reserves_auto_step(interval_s=INTERVAL_S, now=T0 + timedelta(seconds=10)) == []
    assert reserve_of(market) == D("0.001")
    assert not ReserveChange.objects.exists()


def test_the_periodic_task_steps_the_markets_whose_auto_reserve_is_on(market) -> None:
    assert settings.CELERY_BEAT_SCHEDULE["auto-reserves"] == {
        "task": "market.reserves_auto_step",
        "schedule": settings.AUTO_RESERVE_INTERVAL_S,
        "options": {"expires": settings.AUTO_RESERVE_INTERVAL_S, "ignore_result": True},
    }
    other = market_create("other")  # auto off: not stepped
    tenant = tenant_create("now")
    now = timezone.now()
    for m in (market, other):
        for i in range(5):
            rid = f"{m.slug}-now-{i}"
            request_open(request_id=rid, tenant=tenant, api_key=None, market=m, bid="0.01",
                         hold_amount="0.01", now=now - timedelta(seconds=6))  # fmt: skip
            request_settle(request_id=rid, prompt_tokens=0, cached_tokens=0, completion_tokens=0,
                           ttft_s=5.0, now=now - timedelta(seconds=1))  # fmt: skip
    assert reserves_auto_step_task() == 1
    assert reserve_of(market) == D("0.001125")  # (5 - 2) / 2 -> 1: x 9/8
    assert reserve_of(other) == D("0")


def test_turning_it_on_and_off_is_audited_and_bad_targets_are_refused() -> None:
    market = market_create("switch")
    operator = get_user_model().objects.create_user("op", is_staff=True)
    change = market_auto_reserve_set(market=market, enabled=True, target_s=1.5, user=operator)
    assert (change.old, change.new, change.changed_by) == ("off", "on, p90 <= 1.5 s", operator)
    assert market_auto_reserve_set(market=market, enabled=True, target_s=1.5, user=None) is None
    for bad in (0, -1.0, float("nan"), float("inf"), "2"):
        with pytest.raises(ValueError, match="target wait"):
            market_auto_reserve_set(market=market, enabled=True, target_s=bad, user=operator)
    market.refresh_from_db()
    assert (market.auto_reserve, market.auto_reserve_target_s) == (True, 1.5)
    assert market_auto_reserve_set(market=market, enabled=False, user=operator).new == "off"
    assert ControlChange.objects.filter(market=market).count() == 2


def test_alert_thresholds_are_audited_and_bad_ones_refused() -> None:
    market = market_create("alerts")
    operator = get_user_model().objects.create_user("op", is_staff=True)
    changes = market_alerts_set(market=market, queue=50, ttft_p99_s=2.5, user=operator)
    assert [(c.control, c.old, c.new) for c in changes] == [
        ("alert_queue", "off", "50"),
        ("alert_ttft_p99", "off", "2.5"),
    ]
    assert market_alerts_set(market=market, queue=50, ttft_p99_s=2.5, user=operator) == []
    for queue, ttft in ((-1, None), (True, None), (1.5, None), (None, 0.0), (None, "x")):
        with pytest.raises(ValueError, match="threshold"):
            market_alerts_set(market=market, queue=queue, ttft_p99_s=ttft, user=operator)
    market.refresh_from_db()
    assert (market.alert_queue, market.alert_ttft_p99_s) == (50, 2.5)
    changes = market_alerts_set(market=market, queue=None, ttft_p99_s=2.5, user=operator)
    assert [(c.control, c.old, c.new) for c in changes] == [("alert_queue", "50", "off")]
