"""The market's wait bound (mechanism.aging): set on the console next to the policy, checked,
audited as a control change, and pushed to the engines with the policy and reserve."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from market.engine_control import engine_config_push
from market.models import ControlChange, Market
from market.services import market_wait_bound_set
from tests.accounts.factories import market_create
from tests.market.test_engine_control import engine_url_set, sim  # noqa: F401 - the fixture
from tests.personas import PERSONAS, logged_in, world_create

AT = datetime(2026, 12, 4, 5, tzinfo=UTC)
CONSOLE = "/console/markets/test-llm/"
OUT_OF_RANGE = "the wait bound must be 0 (off) or 0.5..3600 seconds"


@pytest.mark.django_db
def test_the_bound_is_checked_audited_and_pushed_once_committed(
    django_capture_on_commit_callbacks,
) -> None:
    market = market_create()
    assert market.wait_bound_s == 0.0  # off unless the operator sets it
    operator = get_user_model().objects.create_user("op", is_staff=True)
    with django_capture_on_commit_callbacks(execute=False) as queued:
        change = market_wait_bound_set(market=market, wait_bound_s=30, user=operator, now=AT)
    assert len(queued) == 1  # the push to the engines, after the commit
    assert (change.control, change.old, change.new, change.changed_by, change.at) == (
        "wait_bound_s", "0", "30", operator, AT,
    )  # fmt: skip
    assert Market.objects.get(pk=market.pk).wait_bound_s == 30.0 == market.wait_bound_s
    assert market_wait_bound_set(market=market, wait_bound_s=30.0, user=operator) is None
    market_wait_bound_set(market=market, wait_bound_s=0.5, user=None, now=AT)
    market_wait_bound_set(market=market, wait_bound_s=0, user=None, now=AT)
    for bad in (0.4, -1, 3600.5, float("nan"), float("inf"), "30", True, None):
        with pytest.raises(ValueError, match="wait bound must be 0"):
            market_wait_bound_set(market=market, wait_bound_s=bad, user=operator)
    rows = [(c.old, c.new) for c in ControlChange.objects.order_by("id")]
    assert rows == [("0", "30"), ("30", "0.5"), ("0.5", "0")]
    assert Market.objects.get(pk=market.pk).wait_bound_s == 0.0


@pytest.mark.django_db
def test_the_database_refuses_a_bound_out_of_range() -> None:
    market = market_create()
    for bad in (0.25, 7200.0, -3.0):
        with pytest.raises(IntegrityError), transaction.atomic():
            Market.objects.filter(pk=market.pk).update(wait_bound_s=bad)
    Market.objects.filter(pk=market.pk).update(wait_bound_s=3600.0)


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
            "wait_bound_s", "0", "45", "operator",
        )  # fmt: skip
        page = client.get(CONSOLE).content.decode()
        form = page[page.index('id="wait-bound-form"') :]
        # The defaults: $0.004/s per prompt token at the bound, in 16 steps.
        assert (
            "a request that has waited this long ranks as if it bid $4/s more per 1,000 prompt "
            "tokens, reached in 16 steps as it waits"
        ) in form.lower()
        assert "0 turns it off" in form
        assert 'value="45"' in form
        audit = page[page.index('data-control="wait_bound_s"') :]
        assert "Wait bound (s)" in audit[:400] and "<strong>45</strong>" in audit[:400]
    else:
        if persona == "anonymous":
            assert response.status_code == 302 and "/accounts/login/" in response["Location"]
        else:
            assert response.status_code == 403
        assert market.wait_bound_s == 0.0 and not ControlChange.objects.exists()


@pytest.mark.django_db
def test_a_bad_bound_on_the_console_says_why_and_changes_nothing(client) -> None:
    world = world_create()
    logged_in(client, world, "operator")
    for bad in ["0.1", "abc", "-5", "NaN", "99999", ""]:
        page = client.post(f"{CONSOLE}wait-bound/", {"wait_bound_s": bad}, follow=True)
        text = page.content.decode()
        assert "Wait bound not changed" in text, bad
        assert (OUT_OF_RANGE in text) or "number of seconds" in text, bad
    assert not ControlChange.objects.exists()
    ok = client.post(f"{CONSOLE}wait-bound/", {"wait_bound_s": "8"}, follow=True)
    assert "Wait bound 0 s → 8 s" in ok.content.decode()
    off = client.post(f"{CONSOLE}wait-bound/", {"wait_bound_s": "0"}, follow=True)
    assert "Wait bound off" in off.content.decode()
    assert Market.objects.get(slug="test-llm").wait_bound_s == 0.0
