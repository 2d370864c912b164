"""Who sees and changes what, on every tenant page and API endpoint (healthchecks-style).

Personas: an operator (staff), tenant A's admin, A's viewer, tenant B's admin, and an anonymous
visitor. Every endpoint is tried on tenant A's data by each of them: each either gets A's data
(and none of B's), or 404 (B's admin: A does not exist for them), 403 (A's viewer trying to
change something), or a login redirect / 401 (anonymous). Nothing forbidden changes anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from accounts.models import ApiKey, Invoice, Period
from accounts.services import api_key_create, budget_set, invoice_generate, month_bounds
from tests.accounts.factories import spend, user_create
from tests.personas import PERSONAS, login, world_create

pytestmark = pytest.mark.django_db

B_MARKERS = ["globex", "Globex", "GLOBEX", "b-req", "b-key-name"]


@dataclass
class Data:
    """The world's (``tests.personas``) tenants' data: budgets, keys, charges, invoices."""

    a_invoice: Invoice
    b_invoice: Invoice
    a_key: ApiKey
    b_key: ApiKey


@pytest.fixture
def world(client) -> Data:
    world = world_create()
    a, b, market = world.a, world.b, world.market
    budget_set(tenant=a, limit="10", period=Period.MONTH)
    budget_set(tenant=b, limit="20", period=Period.MONTH)
    a_key, _ = api_key_create(tenant=a, name="a-key-name", created_by=None)
    b_key, _ = api_key_create(tenant=b, name="b-key-name", created_by=None, budget_limit="7")
    now = datetime.now(UTC)
    spend(tenant=a, market=market, request_id="a-req-1", charge=0.25, at=now, api_key=a_key)
    spend(tenant=b, market=market, request_id="b-req-1", charge=0.5, at=now, api_key=b_key)
    start, end = month_bounds(year=2026, month=10)
    past = datetime(2026, 10, 15, tzinfo=UTC)
    spend(tenant=a, market=market, request_id="a-req-old", charge=1.0, at=past)
    spend(tenant=b, market=market, request_id="b-req-old", charge=2.0, at=past)
    return Data(
        a_invoice=invoice_generate(tenant=a, period_start=start, period_end=end),
        b_invoice=invoice_generate(tenant=b, period_start=start, period_end=end),
        a_key=a_key,
        b_key=b_key,
    )


# (name, method, url template, kind, access): {inv} is A's invoice, {key} A's key.
ENDPOINTS = [
    ("tenant home", "get", "/tenants/acme/", "page", "read"),
    ("key list", "get", "/tenants/acme/keys/", "page", "read"),
    ("invoice list", "get", "/tenants/acme/invoices/", "page", "read"),
    ("invoice", "get", "/tenants/acme/invoices/{inv}/", "page", "read"),
    ("invoice csv", "get", "/tenants/acme/invoices/{inv}/csv/", "page", "read"),
    ("invoice pdf", "get", "/tenants/acme/invoices/{inv}/pdf/", "page", "read"),
    ("budget json", "get", "/api/tenants/acme/budget/", "api", "read"),
    ("usage json", "get", "/api/tenants/acme/usage/", "api", "read"),
    ("keys json", "get", "/api/tenants/acme/keys/", "api", "read"),
    ("invoices json", "get", "/api/tenants/acme/invoices/", "api", "read"),
    ("invoice json", "get", "/api/tenants/acme/invoices/{inv}/", "api", "read"),
    ("create key", "post", "/tenants/acme/keys/", "page", "create"),
    ("revoke key", "post", "/tenants/acme/keys/{key}/revoke/", "page", "revoke"),
    ("create key json", "post", "/api/tenants/acme/keys/", "api", "create"),
    ("revoke key json", "post", "/api/tenants/acme/keys/{key}/revoke/", "api", "revoke"),
]


# What of A's own data each read endpoint must show to those who may read it.
OWN_DATA = {
    "tenant home": "$10.00",  # A's budget limit, as people read it (accounts/figures.py)
    "key list": "a-key-name",
    "invoice list": "INV-acme",
    "invoice": "2026-10-15",  # the day of a-req-old's charge: the page and PDF sum by day
    "invoice csv": "a-req-old",
    "invoice pdf": "2026-10-15",
    "budget json": "10.000000000",
    "usage json": "a-req-1",
    "keys json": "a-key-name",
    "invoices json": "INV-acme",
    "invoice json": "a-req-old",
}


def expected_status(persona: str, kind: str, access: str) -> int:
    if persona == "anonymous":
        return 302 if kind == "page" else 401
    if persona == "b_admin":
        return 404
    if persona == "a_viewer" and access != "read":
        return 403
    if access == "create":
        return 200 if kind == "page" else 201
    if access == "revoke" and kind == "page":
        return 302  # back to the key list
    return 200


def request(client, method: str, url: str, access: str):
    if method == "get":
        return client.get(url)
    if access == "create" and url.startswith("/api/"):
        return client.post(url, json.dumps({"name": "new-key"}), content_type="application/json")
    return client.post(url, {"name": "new-key"})


def body_text(response) -> str:
    if response.get("Content-Type") == "application/pdf":
        from io import BytesIO

        from pypdf import PdfReader

        return "\n".join(p.extract_text() for p in PdfReader(BytesIO(response.content)).pages)
    return response.content.decode()


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize(
    ("name", "method", "url", "kind", "access"), ENDPOINTS, ids=[e[0] for e in ENDPOINTS]
)
def test_every_endpoint_for_every_persona(
    client, world, persona, name, method, url, kind, access
) -> None:
    login(client, persona)
    url = url.format(inv=world.a_invoice.pk, key=world.a_key.pk)
    keys_before = ApiKey.objects.count()
    response = request(client, method, url, access)
    want = expected_status(persona, kind, access)
    assert response.status_code == want, (persona, name, response.status_code)
    if persona == "anonymous" and kind == "page":
        assert response["Location"].startswith("/accounts/login/?next=")
    text = body_text(response)
    for marker in B_MARKERS:
        assert marker not in text, (persona, name, marker)
    if want == 200 and access == "read":
        assert OWN_DATA[name] in text, (persona, name)
    allowed = want in (200, 201, 302) and persona != "anonymous"
    assert ApiKey.objects.count() == keys_before + (1 if access == "create" and allowed else 0)
    world.a_key.refresh_from_db()
    assert (world.a_key.revoked_at is not None) == (access == "revoke" and allowed)


@pytest.mark.parametrize("persona", ["operator", "a_admin", "a_viewer"])
@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("get", "/tenants/acme/invoices/{b_inv}/"),
        ("get", "/tenants/acme/invoices/{b_inv}/csv/"),
        ("get", "/tenants/acme/invoices/{b_inv}/pdf/"),
        ("get", "/api/tenants/acme/invoices/{b_inv}/"),
        ("post", "/tenants/acme/keys/{b_key}/revoke/"),
        ("post", "/api/tenants/acme/keys/{b_key}/revoke/"),
    ],
)
def test_another_tenants_object_under_your_tenant_is_not_found(
    client, world, persona, method, url
) -> None:
    login(client, persona)
    url = url.format(b_inv=world.b_invoice.pk, b_key=world.b_key.pk)
    response = getattr(client, method)(url)
    assert response.status_code == 404
    world.b_key.refresh_from_db()
    assert world.b_key.revoked_at is None


def test_b_admin_sees_their_own_tenant_and_only_it(client, world) -> None:
    login(client, "b_admin")
    keys = client.get("/api/tenants/globex/keys/").json()["keys"]
    assert [k["name"] for k in keys] == ["b-key-name"]
    invoices = client.get("/api/tenants/globex/invoices/").json()["invoices"]
    assert [i["total"] for i in invoices] == ["2.000000000"]
    budgets = client.get("/api/tenants/globex/budget/").json()["budgets"]
    assert [(b["scope"], b["limit"]) for b in budgets] == [
        ("tenant", "20.000000000"),
        ("key", "7.000000000"),
    ]
    page = client.get("/tenants/globex/keys/").content.decode()
    assert "b-key-name" in page and "a-key-name" not in page


def test_json_contents_for_a_admin(client, world) -> None:
    login(client, "a_admin")
    budget = client.get("/api/tenants/acme/budget/").json()["budgets"]
    assert [(b["scope"], b["spent"], b["limit"]) for b in budget] == [
        ("tenant", "0.250000000", "10.000000000")
    ]
    usage = client.get("/api/tenants/acme/usage/?hours=2").json()
    assert len(usage["spend_per_hour"]) == 2
    assert [m["total"] for m in usage["by_market"]] == ["0.250000000"]
    assert [t["request_id"] for t in usage["top_requests"]] == ["a-req-1"]
    assert client.get("/api/tenants/acme/usage/?hours=0").status_code == 400
    assert client.get("/api/tenants/acme/usage/?hours=x").status_code == 400
    invoice = client.get(f"/api/tenants/acme/invoices/{world.a_invoice.pk}/").json()
    assert (invoice["total"], [line["request_id"] for line in invoice["lines"]]) == (
        "1.000000000",
        ["a-req-old"],
    )


def test_a_created_key_shows_its_secret_once(client, world) -> None:
    login(client, "a_admin")
    created = client.post(
        "/api/tenants/acme/keys/",
        json.dumps({"name": "bot", "budget_limit": "3.5", "budget_period": "day"}),
        content_type="application/json",
    )
    assert created.status_code == 201
    secret = created.json()["secret"]
    assert secret.startswith("im_") and created.json()["budget"] == {
        "limit": "3.500000000",
        "period": "day",
    }
    listing = client.get("/api/tenants/acme/keys/").content.decode()
    page = client.get("/tenants/acme/keys/").content.decode()
    assert secret not in listing and secret not in page
    html = client.post("/tenants/acme/keys/", {"name": "web-bot"})
    assert html.status_code == 200 and "shown only this once" in html.content.decode()
    assert html["Cache-Control"] == "no-store"


def test_bad_key_requests_are_refused(client, world) -> None:
    login(client, "a_admin")
    assert (
        client.post("/api/tenants/acme/keys/", "{", content_type="application/json").status_code
        == 400
    )
    assert (
        client.post("/api/tenants/acme/keys/", "[]", content_type="application/json").status_code
        == 400
    )
    no_name = client.post(
        "/api/tenants/acme/keys/", json.dumps({}), content_type="application/json"
    )
    assert no_name.status_code == 400 and "name" in no_name.json()["fields"]
    bad_budget = client.post(
        "/api/tenants/acme/keys/",
        json.dumps({"name": "x", "budget_limit": "-1"}),
        content_type="application/json",
    )
    assert bad_budget.status_code == 400
    assert client.delete("/api/tenants/acme/keys/").status_code == 405


def test_an_unknown_tenant_is_not_found_even_for_operators(client, world) -> None:
    login(client, "operator")
    assert client.get("/tenants/nobody/").status_code == 404
    assert client.get("/api/tenants/nobody/budget/").status_code == 404


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_tenant_list_shows_each_persona_the_tenants_they_may_see(
    client, world, persona
) -> None:
    """``/tenants/``: every tenant, with links to its pages, for operators; a member's own
    tenants only (the others do not exist for them, as on the tenant pages); anonymous visitors
    are sent to log in."""
    login(client, persona)
    response = client.get("/tenants/")
    if persona == "anonymous":
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/?next=/tenants/")
        return
    assert response.status_code == 200
    page = response.content.decode()
    visible = {"operator": ["acme", "globex"], "b_admin": ["globex"]}.get(persona, ["acme"])
    for slug in ["acme", "globex"]:
        links = [
            f'href="/tenants/{slug}/dashboard/"',
            f'href="/tenants/{slug}/invoices/"',
            f'href="/tenants/{slug}/keys/"',
            f'href="/tenants/{slug}/"',
        ]
        for link in links:
            assert (link in page) == (slug in visible), (persona, link)
        assert (f'data-tenant="{slug}"' in page) == (slug in visible), (persona, slug)
    if "globex" not in visible:
        for marker in B_MARKERS:
            assert marker not in page, (persona, marker)
    if "acme" in visible:  # A's budget: $0.25 spent of $10.00 this month
        row = page.split('data-tenant="acme"', 1)[1].split("</tr>", 1)[0]
        assert "$0.25" in row and "$10.00" in row and "per month" in row
    # The nav's link to the list is the operators'.
    assert ('href="/tenants/" class="' in page) == (persona == "operator")


def test_the_tenant_list_of_a_user_in_no_tenant_is_empty(client, world) -> None:
    client.force_login(user_create("loner"))
    page = client.get("/tenants/").content.decode()
    assert "You are not a member of any tenant." in page
    assert "/tenants/acme/" not in page and "globex" not in page
