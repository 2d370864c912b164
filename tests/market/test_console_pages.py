"""Every new page for every persona (healthchecks-style): the operator console, its controls,
the tenant dashboard and plotly.js.

Operators see every market and tenant; a member sees the dashboard of their own tenant and gets
403 from the console; another tenant's dashboard does not exist for them (404); anonymous
visitors are sent to the login page. Nothing forbidden changes anything.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.utils import timezone

from accounts.models import AutobidderStep, Period
from accounts.services import budget_set, invoice_generate, month_bounds
from accounts.services.autobidder import autobidder_configure
from market.models import Market, ReserveChange
from tests.accounts.factories import spend
from tests.personas import PERSONAS, World, logged_in, world_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    w = world_create()
    budget_set(tenant=w.a, limit="10", period=Period.MONTH)
    budget_set(tenant=w.b, limit="20", period=Period.MONTH)
    now = datetime.now(UTC)
    spend(tenant=w.a, market=w.market, request_id="a-req-1", charge=0.25, at=now)
    spend(tenant=w.b, market=w.market, request_id="b-req-1", charge=0.5, at=now)
    start, end = month_bounds(year=2026, month=10)
    invoice_generate(tenant=w.a, period_start=start, period_end=end)
    invoice_generate(tenant=w.b, period_start=start, period_end=end)
    return w


def is_login_redirect(response) -> bool:
    return response.status_code == 302 and response["Location"].startswith("/accounts/login/")


CONSOLE = "/console/markets/test-llm/"


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_console_is_for_operators(client, world, persona) -> None:
    logged_in(client, world, persona)
    for url in ["/console/", CONSOLE]:
        response = client.get(url)
        if persona == "operator":
            assert response.status_code in (200, 302), url
        elif persona == "anonymous":
            assert is_login_redirect(response), url
        else:
            assert response.status_code == 403, url


def test_the_console_index_opens_the_only_market(client, world) -> None:
    logged_in(client, world, "operator")
    assert client.get("/console/")["Location"] == CONSOLE
    Market.objects.create(slug="second", name="Second", served_model="org/second")
    page = client.get("/console/").content.decode()
    assert CONSOLE in page and "/console/markets/second/" in page


def test_the_console_shows_the_market_its_tenants_and_the_live_socket(client, world) -> None:
    logged_in(client, world, "operator")
    page = client.get(CONSOLE).content.decode()
    expected = ["Order book", "Reserve price", "Ordering policy", "Reserve changes"]
    expected += ["Revenue and welfare", "Tenants", "/ws/markets/test-llm/", "/assets/plotly.min.js"]
    expected += ["Tenant ACME", "Tenant GLOBEX", "The reserve has not been changed yet."]
    for text in expected:
        assert text in page, text
    # The book itself never carries requests: no request id on the console.
    assert "a-req-1" not in page and "b-req-1" not in page


@pytest.mark.parametrize("persona", PERSONAS)
def test_only_operators_move_the_reserve_and_the_policy(client, world, persona) -> None:
    logged_in(client, world, persona)
    reserve = client.post(f"{CONSOLE}reserve/", {"reserve": "0.002"})
    policy = client.post(f"{CONSOLE}policy/", {"policy": "fcfs"})
    market = Market.objects.get(slug="test-llm")
    if persona == "operator":
        assert reserve.status_code == 302 and policy.status_code == 302
        assert (market.reserve, market.policy) == (Decimal("0.002"), "fcfs")
        (change,) = ReserveChange.objects.all()
        assert (change.old, change.new, change.changed_by.username) == (
            0,
            Decimal("0.002"),
            persona,
        )
    else:
        if persona == "anonymous":
            assert is_login_redirect(reserve) and is_login_redirect(policy)
        else:
            assert reserve.status_code == 403 and policy.status_code == 403
        assert (market.reserve, market.policy) == (Decimal("0"), "dfs-auction-density")
        assert not ReserveChange.objects.exists()


def test_the_reserve_change_is_validated_and_audited_on_the_page(client, world) -> None:
    logged_in(client, world, "operator")
    for bad in ["-1", "abc", "0.0000000001", "NaN", "2000000", ""]:
        page = client.post(f"{CONSOLE}reserve/", {"reserve": bad}, follow=True).content.decode()
        assert "Reserve not changed" in page, bad
    assert not ReserveChange.objects.exists()
    assert Market.objects.get(slug="test-llm").reserve == 0
    page = client.post(f"{CONSOLE}reserve/", {"reserve": "0.0025"}, follow=True).content.decode()
    assert "Reserve 0 → 0.0025 $/s" in page
    assert "engine applies it from its next round" in page
    audit = page[page.index('id="reserve-audit"') :]
    assert "operator" in audit and 'data-new="0.002500000"' in audit and "0.0025</strong>" in audit
    again = client.post(f"{CONSOLE}reserve/", {"reserve": "0.0025"}, follow=True).content.decode()
    assert "already is 0.0025 $/s" in again and ReserveChange.objects.count() == 1
    bad_policy = client.post(f"{CONSOLE}policy/", {"policy": "cheapest"}, follow=True)
    assert "Policy not changed" in bad_policy.content.decode()


def test_an_unknown_market_is_404_for_operators(client, world) -> None:
    logged_in(client, world, "operator")
    assert client.get("/console/markets/nope/").status_code == 404
    assert client.post("/console/markets/nope/reserve/", {"reserve": "1"}).status_code == 404


DASHBOARD = "/tenants/acme/dashboard/"


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_dashboard_is_for_the_tenants_members_and_operators(client, world, persona) -> None:
    logged_in(client, world, persona)
    response = client.get(DASHBOARD)
    if persona == "anonymous":
        assert is_login_redirect(response)
        return
    if persona == "b_admin":
        assert response.status_code == 404  # A does not exist for B
        return
    assert response.status_code == 200
    page = response.content.decode()
    for text in ["Tenant ACME", "a-req-1", "Spend against budget", "Latency by request class",
                 "why this rank", "/ws/tenants/acme/", "/tenants/acme/invoices/",
                 "/tenants/acme/keys/", "/csv/", "/pdf/"]:  # fmt: skip
        assert text in page, text
    for marker in ["globex", "GLOBEX", "b-req"]:
        assert marker not in page, marker


def test_the_nav_bar_links_where_each_persona_may_go(client, world) -> None:
    logged_in(client, world, "a_viewer")
    page = client.get(DASHBOARD).content.decode()
    assert "/tenants/acme/dashboard/" in page and "/tenants/acme/keys/" in page
    assert ">Console<" not in page and "/admin/" not in page and "Log out" in page
    client.logout()
    logged_in(client, world, "operator")
    page = client.get(CONSOLE).content.decode()
    assert ">Console<" in page and "/admin/" in page


@pytest.mark.parametrize("persona", PERSONAS)
def test_plotly_is_served_from_the_package_to_anyone(client, world, persona) -> None:
    logged_in(client, world, persona)
    response = client.get("/assets/plotly.min.js")
    assert response.status_code == 200 and response["Content-Type"] == "text/javascript"
    assert b"plotly" in response.content[:2000].lower() and len(response.content) > 1_000_000
    etag = response["ETag"]
    assert client.get("/assets/plotly.min.js", HTTP_IF_NONE_MATCH=etag).status_code == 304


def test_the_dashboard_shows_what_the_autobidder_reserved_and_gave_away(client, world) -> None:
    auto = autobidder_configure(
        tenant=world.a, enabled=True, budget="1", values={"interactive": "0.01"}
    )
    AutobidderStep.objects.create(
        autobidder=auto, at=timezone.now(), mu=0.5, spent=Decimal("0.1"), target=Decimal("0.1"),
        window_spent=Decimal("0.9"), exposure_factor=0.125, in_flight=Decimal("0.4"),
        uncollected=Decimal("0.0025"),
    )  # fmt: skip
    logged_in(client, world, "a_viewer")
    page = client.get(DASHBOARD).content.decode()
    safety = page[page.index('id="autobid-safety"') :]
    assert "0.125 × $0.400000" in safety and "(given away): $0.002500" in safety
