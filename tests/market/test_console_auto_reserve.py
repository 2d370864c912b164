"""The console's automatic reserve and alert thresholds, for every persona: only operators change
them, each change is audited and shown, bad input changes nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.contrib.admin.sites import site
from django.forms.models import model_to_dict

from market.models import ControlChange, Market, ReserveChange
from tests.personas import PERSONAS, World, logged_in, world_create

pytestmark = pytest.mark.django_db

CONSOLE = "/console/markets/test-llm/"


@pytest.fixture
def world() -> World:
    return world_create()


def initial_of(page: str) -> dict:
    start = page.index('<script id="initial" type="application/json">') + len(
        '<script id="initial" type="application/json">'
    )
    return json.loads(page[start : page.index("</script>", start)])


@pytest.mark.parametrize("persona", PERSONAS)
def test_only_operators_turn_the_automatic_reserve_on_and_set_alerts(client, world, persona):
    logged_in(client, world, persona)
    auto = client.post(f"{CONSOLE}auto-reserve/", {"enabled": "on", "target_s": "1.5"})
    alerts = client.post(f"{CONSOLE}alerts/", {"alert_queue": "40", "alert_ttft_p99_s": "3"})
    market = Market.objects.get(slug="test-llm")
    if persona == "operator":
        assert {auto.status_code, alerts.status_code} == {302}
        assert (market.auto_reserve, market.auto_reserve_target_s) == (True, 1.5)
        assert (market.alert_queue, market.alert_ttft_p99_s) == (40, 3.0)
        audit = ControlChange.objects.order_by("id")
        assert [(c.control, c.old, c.new, c.changed_by.username) for c in audit] == [
            ("auto_reserve", "off", "on, p90 <= 1.5 s", persona),
            ("alert_queue", "off", "40", persona),
            ("alert_ttft_p99", "off", "3", persona),
        ]
    else:
        if persona == "anonymous":
            assert auto.status_code == alerts.status_code == 302
            assert auto["Location"].startswith("/accounts/login/")
        else:
            assert {auto.status_code, alerts.status_code} == {403}
        assert (market.auto_reserve, market.alert_queue, market.alert_ttft_p99_s) == (
            False,
            None,
            None,
        )
        assert not ControlChange.objects.exists()


def test_the_console_shows_the_automatic_reserve_its_moves_and_the_thresholds(client, world):
    logged_in(client, world, "operator")
    page = client.get(CONSOLE).content.decode()
    assert "Off: the reserve moves only when set by hand." in page
    assert 'id="kpi-auto-reserve"' not in page
    client.post(f"{CONSOLE}auto-reserve/", {"enabled": "on", "target_s": "2.5"})
    client.post(f"{CONSOLE}alerts/", {"alert_queue": "40", "alert_ttft_p99_s": "3"})
    market = Market.objects.get(slug="test-llm")
    ReserveChange.objects.create(
        market=market,
        automatic=True,
        old=Decimal("0"),
        new=Decimal("0.000001"),
        at=datetime(2026, 12, 1, 12, tzinfo=UTC),
    )
    page = client.get(CONSOLE).content.decode()
    assert "auto · p90 ≤ 2.5 s" in page  # beside the reserve
    assert "toward a TTFT p90 of 2.5 s" in page
    log = page[page.index('id="reserve-audit"') :]
    log = log[: log.index("</table>")]
    assert '<span class="badge-auto">auto</span>' in log and 'data-new="0.000001000"' in log
    initial = initial_of(page)
    assert initial["auto_reserve"] == {"on": True, "target_s": 2.5}
    assert initial["alerts"] == {"queue": 40, "ttft_p99_s": 3.0}
    controls = page[page.index('id="control-audit"') :]
    assert "on, p90 &lt;= 2.5 s" in controls and "Queue alert (requests waiting)" in controls
    # Off again, and the alerts cleared (blank: none).
    client.post(f"{CONSOLE}auto-reserve/", {"target_s": "2.5"})
    client.post(f"{CONSOLE}alerts/", {"alert_queue": "", "alert_ttft_p99_s": ""})
    market.refresh_from_db()
    assert (market.auto_reserve, market.alert_queue, market.alert_ttft_p99_s) == (False, None, None)


def test_a_manual_reserve_on_the_console_turns_the_automatic_one_off(client, world):
    logged_in(client, world, "operator")
    client.post(f"{CONSOLE}auto-reserve/", {"enabled": "on", "target_s": "2"})
    client.post(f"{CONSOLE}reserve/", {"reserve": "0.002", "confirmed": "0.002000000"})
    market = Market.objects.get(slug="test-llm")
    assert (market.reserve, market.auto_reserve) == (Decimal("0.002"), False)
    off = ControlChange.objects.filter(control="auto_reserve").order_by("id").last()
    assert (off.old, off.new) == ("on, p90 <= 2 s", "off")


@pytest.mark.parametrize(
    ("url", "data"),
    [
        ("auto-reserve/", {"enabled": "on", "target_s": "0"}),
        ("auto-reserve/", {"enabled": "on", "target_s": "-2"}),
        ("auto-reserve/", {"enabled": "on", "target_s": "soon"}),
        ("auto-reserve/", {"enabled": "on", "target_s": "nan"}),
        ("alerts/", {"alert_queue": "-1", "alert_ttft_p99_s": ""}),
        ("alerts/", {"alert_queue": "2.5", "alert_ttft_p99_s": ""}),
        ("alerts/", {"alert_queue": "", "alert_ttft_p99_s": "0"}),
        ("alerts/", {"alert_queue": "10", "alert_ttft_p99_s": "inf"}),
    ],
)
def test_bad_input_is_refused_with_a_message_and_changes_nothing(client, world, url, data):
    logged_in(client, world, "operator")
    page = client.post(f"{CONSOLE}{url}", data, follow=True).content.decode()
    assert "not changed" in page
    market = Market.objects.get(slug="test-llm")
    assert (market.auto_reserve, market.alert_queue, market.alert_ttft_p99_s) == (False, None, None)
    assert not ControlChange.objects.exists()


def test_the_admin_moves_them_through_the_services_audited(rf, world) -> None:
    admin = site._registry[Market]
    market = Market.objects.get(slug="test-llm")
    request = rf.post("/")
    request.user = world.users["operator"]
    data = {k: v for k, v in model_to_dict(market).items() if v is not None}
    data.update(auto_reserve="on", auto_reserve_target_s="3", alert_queue="25")
    form = admin.get_form(request, market)(data=data, instance=market)
    assert form.is_valid(), form.errors
    admin.save_model(request, form.save(commit=False), form, change=True)
    market.refresh_from_db()
    assert (market.auto_reserve, market.auto_reserve_target_s, market.alert_queue) == (True, 3, 25)
    audit = ControlChange.objects.order_by("id")
    assert [(c.control, c.old, c.new, c.changed_by) for c in audit] == [
        ("auto_reserve", "off", "on, p90 <= 3 s", world.users["operator"]),
        ("alert_queue", "off", "25", world.users["operator"]),
    ]
    data.update(auto_reserve_target_s="0")
    assert not admin.get_form(request, market)(data=data, instance=market).is_valid()
