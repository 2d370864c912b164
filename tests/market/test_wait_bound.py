"""The market's wait bound (mechanism.aging): automatic by default (mechanism.wait_bound,
renewed from the market's served waits), pinned or turned off on the console next to the
policy, checked, audited as a control change, and pushed to the engines with the policy and
reserve."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from accounts.services import request_open, request_settle
from market.engine_control import engine_config_push
from market.models import ControlChange, Market
from market.services import market_wait_bound_set
from market.tasks import wait_bounds_renew
from market.wait_bounds import wait_bound_auto_renew
from tests.accounts.factories import market_create, tenant_create
from tests.market.test_engine_control import engine_url_set, sim  # noqa: F401 - the fixture
from tests.personas import PERSONAS, logged_in, world_create

AT = datetime(2026, 12, 4, 5, tzinfo=UTC)
CONSOLE = "/console/markets/test-llm/"
OUT_OF_RANGE = "the wait bound must be 0 (off) or 0.5..3600 seconds"
PINNED_RANGE = "a pinned wait bound is 0.5..3600 seconds"


@pytest.mark.django_db
def test_the_bound_is_checked_audited_and_pushed_once_committed(
    django_capture_on_commit_callbacks,
) -> None:
    market = market_create()
    assert (market.wait_bound_mode, market.wait_bound_s) == ("auto", 20.0)  # on by default
    operator = get_user_model().objects.create_user("op", is_staff=True)
    with django_capture_on_commit_callbacks(execute=False) as queued:
        change = market_wait_bound_set(market=market, wait_bound_s=30, user=operator, now=AT)
    assert len(queued) == 1  # the push to the engines, after the commit
    assert (change.control, change.old, change.new, change.changed_by, change.at) == (
        "wait_bound_s", "20 (auto)", "30", operator, AT,
    )  # fmt: skip
    assert not change.automatic
    row = Market.objects.get(pk=market.pk)
    assert (row.wait_bound_mode, row.wait_bound_s) == ("pinned", 30.0)
    assert market.wait_bound_s == 30.0 and market.wait_bound_mode == "pinned"
    assert market_wait_bound_set(market=market, wait_bound_s=30.0, user=operator) is None
    market_wait_bound_set(market=market, wait_bound_s=0.5, user=None, now=AT)
    market_wait_bound_set(market=market, wait_bound_s=0, user=None, now=AT)  # 0: off
    market_wait_bound_set(market=market, mode="auto", user=None, now=AT)  # from off: 20 s
    market_wait_bound_set(market=market, mode="pinned", wait_bound_s=45, user=None, now=AT)
    market_wait_bound_set(market=market, mode="auto", user=None, now=AT)  # keeps the 45 s
    market_wait_bound_set(market=market, mode="off", user=None, now=AT)
    for bad in (0.4, -1, 3600.5, float("nan"), float("inf"), "30", True, None):
        with pytest.raises(ValueError, match="wait bound must be 0"):
            market_wait_bound_set(market=market, wait_bound_s=bad, user=operator)
    refusals = [
        ({"mode": "pinned", "wait_bound_s": 0}, PINNED_RANGE + r" \(to turn it off choose off\)"),
        ({"mode": "pinned", "wait_bound_s": 0.25}, PINNED_RANGE + ".*got 0.25"),
        ({"mode": "auto", "wait_bound_s": 30}, "set by hand only when pinned"),
        ({"mode": "off", "wait_bound_s": 30}, "set by hand only when pinned"),
        ({"mode": "sometimes"}, "the wait bound is auto, pinned, off, not 'sometimes'"),
    ]
    for given, says in refusals:
        with pytest.raises(ValueError, match=says):
            market_wait_bound_set(market=market, user=operator, **given)  # type: ignore[arg-type]
    rows = [(c.old, c.new) for c in ControlChange.objects.order_by("id")]
    assert rows == [
        ("20 (auto)", "30"), ("30", "0.5"), ("0.5", "off"), ("off", "20 (auto)"),
        ("20 (auto)", "45"), ("45", "45 (auto)"), ("45 (auto)", "off"),
    ]  # fmt: skip
    row = Market.objects.get(pk=market.pk)
    assert (row.wait_bound_mode, row.wait_bound_s) == ("off", 0.0)


def served(market: Market, waits: list[float], *, start: datetime = AT) -> None:
    """Requests of ``market`` served one second apart from ``start``, with these times to first
    token (seconds)."""
    tenant = tenant_create(f"t-{market.slug}-{start.timestamp():.0f}-{len(waits)}")
    for i, wait in enumerate(waits):
        rid = f"{market.slug}-{start.timestamp():.0f}-{i}"
        finish = start + timedelta(seconds=i + 1)
        request_open(request_id=rid, tenant=tenant, api_key=None, market=market, bid="0.01",
                     hold_amount="0.01", now=finish - timedelta(seconds=wait))  # fmt: skip
        request_settle(request_id=rid, prompt_tokens=0, cached_tokens=0, completion_tokens=0,
                       ttft_s=wait, e2e_s=wait, now=finish)  # fmt: skip


@pytest.mark.django_db
def test_the_automatic_bound_follows_the_served_waits_by_the_hand_worked_rule(
    django_capture_on_commit_callbacks,
) -> None:
    market = market_create()
    served(market, [1.5] * 31)
    assert wait_bound_auto_renew(market_id=market.pk, now=AT) is None  # 31 < 32: no evidence
    served(market, [1.5], start=AT + timedelta(minutes=1))
    # 32 waits of 1.5 s: target 8 x 1.5 = 12 s < 20 / 1.25: down an eighth, 17.5 -> 18 s.
    with django_capture_on_commit_callbacks(execute=False) as queued:
        change = wait_bound_auto_renew(market_id=market.pk, now=AT)
    assert not queued  # the task queues the push (below), not the renewal
    assert (change.old, change.new, change.automatic, change.changed_by, change.at) == (
        "20 (auto)", "18 (auto)", True, None, AT,
    )  # fmt: skip
    # 18 -> 15.75 -> 16 -> 14; then 12 >= 14 / 1.25 = 11.2: stays.
    assert wait_bound_auto_renew(market_id=market.pk, now=AT).new == "16 (auto)"
    assert wait_bound_auto_renew(market_id=market.pk, now=AT).new == "14 (auto)"
    assert wait_bound_auto_renew(market_id=market.pk, now=AT) is None
    # The newest 512 count: 512 waits of 10 s after them: target 80 > 14 x 1.25: 80 at once.
    served(market, [10.0] * 512, start=AT + timedelta(minutes=2))
    assert wait_bound_auto_renew(market_id=market.pk, now=AT).new == "80 (auto)"
    assert wait_bound_auto_renew(market_id=market.pk, now=AT) is None
    # Pinned or off, the renewal leaves it alone.
    market_wait_bound_set(market=market, wait_bound_s=8, user=None)
    served(market, [100.0] * 512, start=AT + timedelta(hours=1))
    assert wait_bound_auto_renew(market_id=market.pk, now=AT) is None
    assert Market.objects.get(pk=market.pk).wait_bound_s == 8.0


@pytest.mark.django_db
def test_the_periodic_task_renews_every_automatic_market_and_pushes_each_move(
    django_capture_on_commit_callbacks,
) -> None:
    moving, still, pinned = market_create("moving"), market_create("still"), market_create("pin")
    market_wait_bound_set(market=pinned, wait_bound_s=5, user=None)
    for market in (moving, pinned):
        served(market, [1.0] * 40)  # target 6 s: the automatic one falls an eighth, to 18 s
    with django_capture_on_commit_callbacks(execute=False) as queued:
        assert wait_bounds_renew() == 1
    assert len(queued) == 0  # the task queues its pushes itself, not on a commit
    assert Market.objects.get(pk=moving.pk).wait_bound_s == 18.0
    assert Market.objects.get(pk=still.pk).wait_bound_s == 20.0  # nothing served: stays
    assert Market.objects.get(pk=pinned.pk).wait_bound_s == 5.0


@pytest.mark.django_db
def test_the_database_refuses_a_bound_out_of_range() -> None:
    market = market_create()
    for bad in (0.25, 7200.0, -3.0, 0.0):  # 0 is off: only with the mode off
        with pytest.raises(IntegrityError), transaction.atomic():
            Market.objects.filter(pk=market.pk).update(wait_bound_s=bad)
    with pytest.raises(IntegrityError), transaction.atomic():
        Market.objects.filter(pk=market.pk).update(wait_bound_mode="off")  # with 20 s
    Market.objects.filter(pk=market.pk).update(wait_bound_s=3600.0)
    Market.objects.filter(pk=market.pk).update(wait_bound_mode="off", wait_bound_s=0.0)


@pytest.mark.django_db
def test_the_push_carries_the_bound_to_the_engine(sim, eager) -> None:  # noqa: F811
    market = market_create()
    engine_url_set(market, sim.url)
    Market.objects.filter(pk=market.pk).update(wait_bound_s=12.5)
    assert engine_config_push(market_id=market.pk) == "pushed"
    knobs = sim.call(lambda: sim.server.engine.knobs)
    assert (knobs.wait_bound_s, knobs.reserve) == (12.5, 0.0)
    assert sim.call(lambda: sim.server.engine.policy) == market.policy


@pytest.mark.django_db
@pytest.mark.parametrize("persona", PERSONAS)
def test_only_operators_set_the_bound_on_the_console(client, persona) -> None:
    world = world_create()
    logged_in(client, world, persona)
    response = client.post(f"{CONSOLE}wait-bound/", {"wait_bound_s": "45"})
    market = Market.objects.get(slug="test-llm")
    if persona == "operator":
        assert response.status_code == 302 and market.wait_bound_s == 45.0
        (change,) = ControlChange.objects.all()
        assert (change.control, change.old, change.new, change.changed_by.username) == (
            "wait_bound_s", "20 (auto)", "45", "operator",
        )  # fmt: skip
        page = client.get(CONSOLE).content.decode()
        form = page[page.index('id="wait-bound-form"') :]
        # The defaults: $0.003/s per prompt token at the bound, in 8 steps.
        assert (
            "a request that has waited this long ranks as if it bid $3/s more per 1,000 prompt "
            "tokens, reached in 8 steps as it waits"
        ) in form.lower()
        assert 'value="45"' in form and '<option value="pinned" selected>' in form
        assert "In force: 45 s, pinned" in form
        audit = page[page.index('data-control="wait_bound_s"') :]
        assert "Wait bound (s)" in audit[:400] and "<strong>45</strong>" in audit[:400]
    else:
        if persona == "anonymous":
            assert response.status_code == 302 and "/accounts/login/" in response["Location"]
        else:
            assert response.status_code == 403
        assert market.wait_bound_s == 20.0 and not ControlChange.objects.exists()


@pytest.mark.django_db
def test_a_bad_bound_on_the_console_says_why_and_changes_nothing(client) -> None:
    world = world_create()
    logged_in(client, world, "operator")
    for bad in ["0.1", "abc", "-5", "NaN", "99999", ""]:
        page = client.post(f"{CONSOLE}wait-bound/", {"wait_bound_s": bad}, follow=True)
        text = page.content.decode()
        assert "Wait bound not changed" in text, bad
        assert (OUT_OF_RANGE in text) or "number of seconds" in text, bad
    for mode, bad, says in [
        ("pinned", "0", "a pinned wait bound is 0.5..3600 seconds (to turn it off choose off)"),
        ("pinned", "0.25", "a pinned wait bound is 0.5..3600 seconds"),
        ("pinned", "", "is not a number of seconds"),
        ("never", "", "the wait bound is auto, pinned, off, not &#x27;never&#x27;"),
    ]:
        page = client.post(
            f"{CONSOLE}wait-bound/", {"mode": mode, "wait_bound_s": bad}, follow=True
        )
        text = page.content.decode()
        assert "Wait bound not changed" in text and says in text, (mode, bad, text[-3000:])
    assert not ControlChange.objects.exists()
    page = client.get(CONSOLE).content.decode()
    form = page[page.index('id="wait-bound-form"') :]
    assert '<option value="auto" selected>' in form
    assert "In force: 20 s, set automatically from the market&#x27;s recent waits" in form
    assert (
        "every 10 s: toward 8 x the mean time to first token of the last 512 requests served, "
        "up at once, down by at most 12.5% a renewal, left alone within 25%, 2-600 s"
    ) in form
    ok = client.post(f"{CONSOLE}wait-bound/", {"mode": "pinned", "wait_bound_s": "8"}, follow=True)
    assert "Wait bound now 8 s, pinned (was 20 (auto))" in ok.content.decode()
    # The form sends the length shown whatever the mode: only pinned reads it.
    auto = client.post(f"{CONSOLE}wait-bound/", {"mode": "auto", "wait_bound_s": "8"}, follow=True)
    assert "Wait bound now 8 s, set automatically" in auto.content.decode()
    off = client.post(f"{CONSOLE}wait-bound/", {"mode": "off"}, follow=True)
    assert "Wait bound off" in off.content.decode()
    assert Market.objects.get(slug="test-llm").wait_bound_s == 0.0


@pytest.mark.django_db
def test_the_admin_says_what_the_bound_does_in_the_rules_own_numbers(admin_client) -> None:
    # The model's help text only names the rule (a default's change needs no migration); the
    # admin's form says it with the defaults in force: $0.003/s per prompt token, 8 steps.
    market = market_create()
    page = admin_client.get(f"/admin/market/market/{market.pk}/change/").content.decode()
    assert (
        "The wait bound in force, seconds. A request that has waited this long ranks as if it "
        "bid $3/s more per 1,000 prompt tokens, reached in 8 steps as it waits"
    ) in page
    assert "mechanism.aging.WAIT_BOUND_HELP" not in page
