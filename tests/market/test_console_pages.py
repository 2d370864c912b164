"""Every new page for every persona (healthchecks-style): the operator console, its controls,
the tenant dashboard and plotly.js.

Operators see every market and tenant; a member sees the dashboard of their own tenant and gets
403 from the console; another tenant's dashboard does not exist for them (404); anonymous
visitors are sent to the login page. Nothing forbidden changes anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.cache import cache
from django.utils import timezone

from accounts.models import AutobidderStep, Period
from accounts.services import budget_set, invoice_generate, month_bounds
from accounts.services.autobidder import autobidder_configure
from market.live import book
from market.models import ControlChange, Market, ReserveChange
from tests.accounts.factories import spend
from tests.market.live_helpers import record, subtree
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
    # Confirmed (from a reserve of 0 every raise asks first; every switch asks first).
    reserve = client.post(f"{CONSOLE}reserve/", {"reserve": "0.002", "confirmed": "0.002000000"})
    policy = client.post(f"{CONSOLE}policy/", {"policy": "lpm", "confirmed": "lpm"})
    ceiling = client.post(f"{CONSOLE}reserve-max/", {"reserve_max": "5"})
    market = Market.objects.get(slug="test-llm")
    if persona == "operator":
        assert {reserve.status_code, policy.status_code, ceiling.status_code} == {302}
        assert (market.reserve, market.policy) == (Decimal("0.002"), "lpm")
        assert market.reserve_max == Decimal("5")
        (change,) = ReserveChange.objects.all()
        assert (change.old, change.new, change.changed_by.username) == (
            0,
            Decimal("0.002"),
            persona,
        )
        audit = ControlChange.objects.order_by("id")
        assert [(c.control, c.old, c.new, c.changed_by.username) for c in audit] == [
            ("policy", "dfs-auction-kv-split", "lpm", persona),
            ("reserve_max", "1.000000000", "5.000000000", persona),
        ]
    else:
        if persona == "anonymous":
            assert is_login_redirect(reserve) and is_login_redirect(policy)
            assert is_login_redirect(ceiling)
        else:
            assert {reserve.status_code, policy.status_code, ceiling.status_code} == {403}
        assert (market.reserve, market.policy) == (Decimal("0"), "dfs-auction-kv-split")
        assert market.reserve_max == Decimal("1")
        assert not ReserveChange.objects.exists() and not ControlChange.objects.exists()
    impact = client.get(f"{CONSOLE}reserve/impact/?reserve=0.5")
    if persona == "operator":
        assert impact.status_code == 200
    elif persona == "anonymous":
        assert is_login_redirect(impact)
    else:
        assert impact.status_code == 403


def test_the_reserve_change_is_validated_and_audited_on_the_page(client, world) -> None:
    logged_in(client, world, "operator")
    for bad in ["-1", "abc", "0.0000000001", "NaN", "2000000", ""]:
        page = client.post(f"{CONSOLE}reserve/", {"reserve": bad}, follow=True).content.decode()
        assert "Reserve not changed" in page, bad
    assert not ReserveChange.objects.exists()
    assert Market.objects.get(slug="test-llm").reserve == 0
    confirmed = {"reserve": "0.0025", "confirmed": "0.002500000"}
    page = client.post(f"{CONSOLE}reserve/", confirmed, follow=True).content.decode()
    assert "Reserve 0 → 0.0025 $/s" in page
    assert "engine applies it from its next round" in page
    audit = page[page.index('id="reserve-audit"') :]
    assert "operator" in audit and 'data-new="0.002500000"' in audit and "0.0025</strong>" in audit
    again = client.post(f"{CONSOLE}reserve/", {"reserve": "0.0025"}, follow=True).content.decode()
    assert "already is 0.0025 $/s" in again and ReserveChange.objects.count() == 1
    # Within 10x of the reserve in force either way: applied at once, no question.
    for near in ["0.025", "0.0025"]:
        page = client.post(f"{CONSOLE}reserve/", {"reserve": near}, follow=True).content.decode()
        assert "Reserve " in page and 'id="reserve-confirm"' not in page, near
    assert ReserveChange.objects.count() == 3
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
    # By the figures' rule: money to three significant digits, no zeros past the cents.
    assert "0.125 × $0.40;" in safety and "(given away): $0.0025." in safety


def test_the_dashboard_card_has_the_multiplier_and_the_spend_path(client, world) -> None:
    # Two pacing steps today under $2 a day: mu 0.5 then 1.25 with $0.30 then $0.45 paid in
    # the window; the card plots them against the even pace from today's 00:00 UTC ($0) to
    # tomorrow's ($2).
    auto = autobidder_configure(
        tenant=world.a, enabled=True, budget="2", values={"interactive": "0.01"}
    )
    now = timezone.now()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    at = [max(midnight, now - timedelta(seconds=s)) for s in (20, 10)]
    for when, mu, paid in zip(at, (0.5, 1.25), ("0.3", "0.45"), strict=True):
        AutobidderStep.objects.create(
            autobidder=auto, at=when, mu=mu, spent=Decimal("0.1"), target=Decimal("0.1"),
            window_spent=Decimal(paid),
        )  # fmt: skip
    logged_in(client, world, "a_viewer")
    page = client.get(DASHBOARD).content.decode()
    tag = '<script id="initial" type="application/json">'
    start = page.index(tag) + len(tag)
    card = json.loads(page[start : page.index("</script>", start)])["autobidder"]
    assert card["steps"] == [
        [at[0].timestamp(), 0.5, "0.300000000"],
        [at[1].timestamp(), 1.25, "0.450000000"],
    ]
    assert (card["enabled"], card["mu"], card["budget"], card["period"]) == (
        True, 0.0, "2.000000000", "day"
    )  # fmt: skip
    assert card["start"] == midnight.timestamp()
    assert card["end"] == (midnight + timedelta(days=1)).timestamp()
    assert 'id="chart-mu"' in page and 'id="mu-note"' in page


@pytest.fixture
def fresh_book() -> Iterator[None]:
    """The test market's live book starts empty, and is left so (the cache may be Redis)."""
    cache.delete(book.state_key("test-llm"))
    yield
    cache.delete(book.state_key("test-llm"))


def test_a_reserve_far_from_the_one_in_force_asks_first_saying_what_it_does_to_the_book(
    client, world, fresh_book
) -> None:
    """The incident: 1,000,000 $/s typed for 0.001 was applied and every bid dropped to 0. Now
    a reserve beyond 10x either way comes back as a question with the book's count, and one
    above the ceiling is refused with the reason."""
    Market.objects.filter(slug="test-llm").update(reserve="0.001")
    # The book waiting now, as two replicas' last book records carried it (their sorted bids
    # and queue lengths): 0.0005 0.002 0.004 | 0.001 0.01 0.03 0.05.
    for engine, bids in (("r1", [0.0005, 0.002, 0.004]), ("r2", [0.001, 0.01, 0.03, 0.05])):
        rec = record("test-llm", 1, subtrees=[subtree(f"k-{engine}")], waiting=len(bids),
                     engine=engine, reserve=0.001)  # fmt: skip
        rec["waiting_bids"] = bids
        assert book.book_publish(record=rec, rows=book.book_rows(rec), min_interval_s=0) == "sent"
    logged_in(client, world, "operator")
    asked = client.post(f"{CONSOLE}reserve/", {"reserve": "0.02"})
    assert asked.status_code == 302
    assert asked["Location"] == f"{CONSOLE}?confirm_reserve=0.020000000#controls"
    assert Market.objects.get(slug="test-llm").reserve == Decimal("0.001")
    page = client.get(asked["Location"]).content.decode()
    question = page[page.index('id="reserve-confirm"') :]
    question = question[: question.index("</div>")]
    assert "Set the reserve to 0.02 $/s?" in question
    assert "That is 20× the reserve in force (0.001 $/s)." in question
    # Below 0.02: 0.0005 0.002 0.004 0.001 0.01 (5 of 7); below 0.001 now: 0.0005 (1); so 4 of
    # the requests whose bids count now would lose their priority.
    assert "<strong>5 of 7</strong> waiting bids are below it (1 below the reserve in force)" in (
        question
    )
    assert "4 requests would lose their priority" in question
    assert 'name="confirmed" value="0.020000000"' in question
    # The JSON the form reads while the operator types says the same.
    impact = client.get(f"{CONSOLE}reserve/impact/?reserve=0.02").json()
    assert impact == {
        "reserve": "0.020000000",
        "current": "0.001000000",
        "ceiling": "1.000000000",
        "above_ceiling": False,
        "confirm": True,
        "impact": {"waiting": 7, "below": 5, "below_now": 1, "lose_priority": 4,
                   "gain_priority": 0, "exact": True},
    }  # fmt: skip
    assert client.get(f"{CONSOLE}reserve/impact/?reserve=abc").status_code == 400
    # Confirmed: applied and audited.
    done = client.post(
        f"{CONSOLE}reserve/", {"reserve": "0.02", "confirmed": "0.020000000"}, follow=True
    )
    assert "Reserve 0.001 → 0.02 $/s" in done.content.decode()
    assert Market.objects.get(slug="test-llm").reserve == Decimal("0.02")
    # A confirmation of another value does not count; a cut under a tenth asks too.
    client.post(f"{CONSOLE}reserve/", {"reserve": "0.001", "confirmed": "0.020000000"})
    assert Market.objects.get(slug="test-llm").reserve == Decimal("0.02")
    # Above the ceiling (1 $/s by default): refused, with the ceiling named, confirmed or not.
    for form in ({"reserve": "1000000"}, {"reserve": "1000000", "confirmed": "1000000.000000000"}):
        page = client.post(f"{CONSOLE}reserve/", form, follow=True).content.decode()
        assert "Reserve not changed: 1000000 $/s is above this market&#x27;s ceiling of 1 $/s" in (
            page
        )
    assert ReserveChange.objects.count() == 1
    # Raised, the ceiling lets it through (still asked first: 50x).
    client.post(f"{CONSOLE}reserve-max/", {"reserve_max": "2"})
    assert client.post(f"{CONSOLE}reserve/", {"reserve": "1"})["Location"].endswith(
        "confirm_reserve=1.000000000#controls"
    )
    # A ceiling under the reserve in force is refused: lower the reserve first.
    page = client.post(f"{CONSOLE}reserve-max/", {"reserve_max": "0.01"}, follow=True)
    assert "below the reserve in force; lower the reserve first" in page.content.decode()
    assert Market.objects.get(slug="test-llm").reserve_max == Decimal("2")


def test_a_policy_switch_asks_first_explains_both_policies_and_is_audited(client, world) -> None:
    logged_in(client, world, "operator")
    page = client.get(CONSOLE).content.decode()
    # Each policy offered with its line, and the one in force explained under the switch.
    assert (
        'data-description="Longest cached prefix first, for the cache; bids buy nothing."' in page
    )
    assert "Neither the policy nor the ceiling has been changed yet." in page
    asked = client.post(f"{CONSOLE}policy/", {"policy": "dfs-auction-density"})
    assert asked["Location"] == f"{CONSOLE}?confirm_policy=dfs-auction-density#controls"
    assert Market.objects.get(slug="test-llm").policy == "dfs-auction-kv-split"
    question = client.get(asked["Location"]).content.decode()
    question = question[question.index('id="policy-confirm"') :]
    assert "siblings by bid per token of work" in question and "compete one by one" in question
    page = client.post(
        f"{CONSOLE}policy/",
        {"policy": "dfs-auction-density", "confirmed": "dfs-auction-density"},
        follow=True,
    ).content.decode()
    assert "Policy dfs-auction-kv-split → dfs-auction-density" in page
    audit = page[page.index('id="control-audit"') :]
    assert (
        "operator" in audit
        and "<code>dfs-auction-kv-split</code> → <strong><code>dfs-auction-density" in (audit)
    )
    (change,) = ControlChange.objects.all()
    assert (change.control, change.old, change.new, change.changed_by.username) == (
        "policy", "dfs-auction-kv-split", "dfs-auction-density", "operator"
    )  # fmt: skip


def test_baselines_are_not_offered_and_a_market_on_one_can_leave_it(client, world) -> None:
    """The benchmarks' baselines are not on the switch; a market left on one (set before they
    were withdrawn) shows it as in force, and the switch refuses to move to another."""
    logged_in(client, world, "operator")
    page = client.get(CONSOLE).content.decode()
    assert 'value="fcfs"' not in page and 'value="highest-bid"' not in page
    refused = client.post(
        f"{CONSOLE}policy/", {"policy": "highest-bid", "confirmed": "highest-bid"}, follow=True
    )
    assert Market.objects.get(slug="test-llm").policy == "dfs-auction-kv-split"
    assert not ControlChange.objects.exists()
    assert "Policy not changed" in (refused := refused.content.decode())
    assert "not offered for a market" in refused
    Market.objects.filter(slug="test-llm").update(policy="fcfs")
    page = client.get(CONSOLE).content.decode()
    assert 'value="fcfs"' in page  # in force, so listed
    client.post(f"{CONSOLE}policy/", {"policy": "lpm", "confirmed": "lpm"})
    assert Market.objects.get(slug="test-llm").policy == "lpm"


def test_every_policy_of_the_registry_has_its_line() -> None:
    from market.controls import POLICY_DESCRIPTIONS
    from mechanism import POLICIES

    assert set(POLICY_DESCRIPTIONS) == set(POLICIES)
    assert all(len(line) < 120 and line.endswith(".") for line in POLICY_DESCRIPTIONS.values())


def test_the_consoles_tenant_table_links_each_tenant_and_the_list_of_all(client, world) -> None:
    """The table's rows are drawn in the browser (static/js/console.js) from the URL patterns
    the table carries; the header links the list of every tenant (``/tenants/``)."""
    logged_in(client, world, "operator")
    page = client.get(CONSOLE).content.decode()
    assert 'data-dashboard-url="/tenants/__tenant__/dashboard/"' in page
    assert 'data-invoices-url="/tenants/__tenant__/invoices/"' in page
    assert 'id="tenants-all"' in page and 'href="/tenants/"' in page
