"""``seed_demo``: the demo operator and tenants, idempotent, with logins that work, and a closed
past month of traffic with its invoice for each tenant."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from io import BytesIO, StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from pypdf import PdfReader

from accounts.models import (
    ApiKey,
    Autobidder,
    Budget,
    BudgetCounter,
    ChargeKind,
    Invoice,
    InvoiceLine,
    LedgerEntry,
    Membership,
    Request,
    Role,
    Tenant,
)
from accounts.services import (
    demo_accounts_seed,
    invoice_generate,
    month_bounds,
    request_open,
    request_settle,
)
from market.models import Market
from market.services import market_demo_seed

pytestmark = pytest.mark.django_db

# The demo logins as the README promises them (written out, not imported from the code).
EXPECTED_LOGINS = {
    "operator": "operator-demo-pass",
    "acme-admin": "acme-demo-pass",
    "globex-admin": "globex-demo-pass",
}


def seed() -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def database_snapshot() -> dict[str, list[tuple]]:
    """Every row seed_demo may touch, with the columns that would change."""
    return {
        "users": list(
            get_user_model()
            .objects.order_by("id")
            .values_list("id", "username", "password", "is_staff", "is_superuser", "is_active")
        ),
        "tenants": list(
            Tenant.objects.order_by("id").values_list("id", "slug", "name", "created_at")
        ),
        "memberships": list(
            Membership.objects.order_by("id").values_list(
                "id", "tenant_id", "user_id", "role", "created_at"
            )
        ),
        "budgets": list(
            Budget.objects.order_by("id").values_list("id", "tenant_id", "limit", "updated_at")
        ),
        "markets": list(Market.objects.order_by("id").values_list("id", "slug", "updated_at")),
        "autobidders": list(
            Autobidder.objects.order_by("id").values_list("id", "tenant_id", "mu", "updated_at")
        ),
        "keys": list(ApiKey.objects.order_by("id").values_list("id", "name", "prefix")),
        "requests": list(
            Request.objects.order_by("request_id").values_list("request_id", "status")
        ),
        "entries": list(
            LedgerEntry.objects.order_by("id").values_list("id", "request_id", "kind", "amount")
        ),
        "counters": list(
            BudgetCounter.objects.order_by("id").values_list("id", "spent_total", "held")
        ),
        "invoices": list(
            Invoice.objects.order_by("id").values_list("id", "tenant_id", "period_start", "total")
        ),
        "invoice_lines": list(InvoiceLine.objects.order_by("id").values_list("id", "total")),
    }


def test_seed_demo_twice_changes_nothing() -> None:
    first_output = seed()
    after_first = database_snapshot()
    second_output = seed()
    assert database_snapshot() == after_first
    assert first_output == second_output
    assert len(after_first["users"]) == 3
    assert len(after_first["tenants"]) == 2
    assert len(after_first["memberships"]) == 2
    assert len(after_first["budgets"]) == 2
    assert len(after_first["markets"]) == 1
    assert len(after_first["invoices"]) == 2
    assert len(after_first["requests"]) > 0 and len(after_first["entries"]) > 0


def test_printed_logins_work(client) -> None:
    output = seed()
    for username, password in EXPECTED_LOGINS.items():
        assert f"{username}" in output and password in output
        assert client.login(username=username, password=password), username
        client.logout()


def test_operator_is_staff_and_tenant_admins_are_members() -> None:
    seed()
    users = get_user_model().objects
    operator = users.get(username="operator")
    assert operator.is_staff and operator.is_superuser
    assert not operator.memberships.exists()
    for username, slug in [("acme-admin", "acme"), ("globex-admin", "globex")]:
        user = users.get(username=username)
        assert not user.is_staff
        assert list(user.tenants.values_list("slug", flat=True)) == [slug]
        assert user.memberships.get().role == Role.ADMIN


def test_seed_demo_gives_each_tenant_a_monthly_budget_and_seeds_a_market() -> None:
    output = seed()
    for slug in ["acme", "globex"]:
        budget = Budget.objects.get(tenant__slug=slug, api_key=None)
        assert (budget.period, str(budget.limit)) == ("month", "50.000000000")
    market = Market.objects.get()
    assert market.slug in output and market.is_active


def test_seed_demo_repairs_a_changed_password(client) -> None:
    seed()
    operator = get_user_model().objects.get(username="operator")
    operator.set_password("something-else-entirely")
    operator.save()
    seed()
    assert client.login(username="operator", password=EXPECTED_LOGINS["operator"])


def test_home_page_shows_the_tenant(client) -> None:
    seed()
    client.login(username="acme-admin", password=EXPECTED_LOGINS["acme-admin"])
    response = client.get("/")
    assert response.status_code == 200
    assert "Acme Corp" in response.content.decode()
    assert "Globex" not in response.content.decode()


def test_home_page_links_each_tenant_to_its_pages(client) -> None:
    seed()
    client.login(username="acme-admin", password=EXPECTED_LOGINS["acme-admin"])
    page = client.get("/").content.decode()
    # The tenant's name leads to its page, and its dashboard and invoices are a click away.
    assert '<a href="/tenants/acme/">Acme Corp</a>' in page
    for url in ("/tenants/acme/", "/tenants/acme/dashboard/", "/tenants/acme/invoices/"):
        assert f'href="{url}"' in page, url
        assert client.get(url).status_code == 200, url
    assert "/tenants/globex/" not in page


def previous_month_by_hand(today: date) -> tuple[datetime, datetime]:
    """The UTC month before ``today``'s, worked out without the code under test."""
    end = datetime(today.year, today.month, 1, tzinfo=UTC)
    last_day = end - timedelta(days=1)
    return datetime(last_day.year, last_day.month, 1, tzinfo=UTC), end


def test_seed_demo_gives_each_tenant_an_invoice_of_a_closed_past_month() -> None:
    output = seed()
    start, end = previous_month_by_hand(datetime.now(UTC).date())
    for slug in ["acme", "globex"]:
        invoice = Invoice.objects.get(tenant__slug=slug)
        assert (invoice.period_start, invoice.period_end) == (start, end)
        assert invoice.period_end <= datetime.now(UTC)  # closed
        assert invoice.number in output
        # The total is the brute-force sum of the tenant's ledger entries of that month.
        entries = list(
            LedgerEntry.objects.filter(tenant__slug=slug, created_at__gte=start, created_at__lt=end)
        )
        assert invoice.total == sum(e.amount for e in entries) > 0
        assert (
            invoice.priority_total
            == sum(e.amount for e in entries if e.kind == ChargeKind.PRIORITY)
            > 0
        )
        assert (
            invoice.tokens_total
            == sum(e.amount for e in entries if e.kind == ChargeKind.TOKENS)
            > 0
        )
        # Several days, the tenant's keys and requests without a key; a modest number.
        days = {e.created_at.astimezone(UTC).date() for e in entries}
        keys = {e.api_key.name if e.api_key else None for e in entries}
        assert len(days) >= 5 and keys == {"web-app", "nightly-batch", None}
        assert 10 <= invoice.lines.count() <= 100
        # Every request was served and settled: its hold is closed, nothing left held.
        assert set(Request.objects.filter(tenant__slug=slug).values_list("status", flat=True)) == {
            "served"
        }
        assert not BudgetCounter.objects.filter(tenant__slug=slug).exclude(held=0).exists()


def test_the_console_shows_the_seeded_invoice_on_first_look(client) -> None:
    seed()
    client.login(username="acme-admin", password=EXPECTED_LOGINS["acme-admin"])
    invoice = Invoice.objects.get(tenant__slug="acme")
    listing = client.get("/tenants/acme/invoices/").content.decode()
    assert invoice.number in listing
    pdf = client.get(f"/tenants/acme/invoices/{invoice.pk}/pdf/")
    assert pdf.status_code == 200
    text = "\n".join(p.extract_text() for p in PdfReader(BytesIO(pdf.content)).pages)
    assert "Acme Corp" in text and "Usage by day (UTC)" in text and "web-app" in text
    assert "console / no key" in text and "Page 1 of" in text
    # A total due in cents, never zero: the seeded month's charges are dollars, not nothing.
    assert "Total due $0.00" not in text and "Total due $" in text


def test_seed_demo_leaves_a_tenant_with_invoices_alone() -> None:
    """Globex already has an invoice (of an older month): no demo traffic is made up for it."""
    demo_accounts_seed()
    globex = Tenant.objects.get(slug="globex")
    old_start, old_end = month_bounds(year=2020, month=1)
    invoice_generate(tenant=globex, period_start=old_start, period_end=old_end)
    seed()
    assert not LedgerEntry.objects.filter(tenant=globex).exists()
    assert Invoice.objects.filter(tenant=globex).count() == 1
    assert LedgerEntry.objects.filter(tenant__slug="acme").exists()


def test_seed_demo_invoices_real_traffic_of_the_past_month_as_it_is() -> None:
    """A past month that already has the tenant's charges is invoiced, not seeded again."""
    demo_accounts_seed()
    market = market_demo_seed()
    acme = Tenant.objects.get(slug="acme")
    start, _ = previous_month_by_hand(datetime.now(UTC).date())
    at = start + timedelta(days=3)
    request_open(request_id="real-1", tenant=acme, api_key=None, market=market, bid="0",
                 hold_amount="1", now=at)  # fmt: skip
    # demo-llm: 1000 prompt tokens at $0.15 per million, 100 completion at $0.60: $0.00021
    request_settle(request_id="real-1", prompt_tokens=1000, cached_tokens=0,
                   completion_tokens=100, now=at)  # fmt: skip
    seed()
    invoice = Invoice.objects.get(tenant=acme)
    assert list(invoice.lines.values_list("request_id", flat=True)) == ["real-1"]
    assert str(invoice.total) == "0.000210000"


def test_the_demo_paces_globex_by_its_autobidder_within_a_day_budget() -> None:
    # Globex's requests send no bid in the demo (the agents' --autobid globex): its autobidder
    # bids for them, its interactive ones worth 5 cents a second, within $1 a day.
    seed()
    auto = Autobidder.objects.get(tenant__slug="globex")
    assert (auto.enabled, auto.budget, auto.period) == (True, Decimal("1"), "day")
    assert auto.values == {"interactive": "0.050000000", "background": "0.005000000"}
    assert not Autobidder.objects.filter(tenant__slug="acme").exists()
    # An operator's change is kept by the next seed.
    Autobidder.objects.filter(pk=auto.pk).update(budget=Decimal("2"))
    seed()
    assert Autobidder.objects.get(pk=auto.pk).budget == Decimal("2")
