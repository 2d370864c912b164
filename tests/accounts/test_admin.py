"""Django admin: every accounts and market model is there; the ledger is read-only."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.urls import reverse

from accounts.models import (
    ApiKey,
    Budget,
    Hold,
    Invoice,
    InvoiceLine,
    LedgerEntry,
    Membership,
    Request,
    Tenant,
)
from accounts.services import api_key_create, budget_set, invoice_generate, month_bounds
from market.models import ControlChange, Market, ReserveChange
from market.services import market_reserve_set
from tests.accounts.factories import PASSWORD, market_create, spend, tenant_create, user_create

pytestmark = pytest.mark.django_db

MODELS = [
    Tenant,
    Membership,
    ApiKey,
    Budget,
    Hold,
    Request,
    LedgerEntry,
    Invoice,
    InvoiceLine,
    Market,
    ReserveChange,
]
READ_ONLY = [LedgerEntry, Hold, Request, Invoice, InvoiceLine, ReserveChange]


@pytest.fixture
def operator_client(client):
    get_user_model().objects.create_superuser("root", password=PASSWORD)
    client.login(username="root", password=PASSWORD)
    tenant = tenant_create("acme")
    user_create("alice", tenant=tenant)
    market = market_create()
    budget_set(tenant=tenant, limit="5")
    api_key_create(tenant=tenant, name="k", created_by=None)
    spend(
        tenant=tenant,
        market=market,
        request_id="r1",
        charge=0.5,
        at=datetime(2026, 10, 5, tzinfo=UTC),
    )
    start, end = month_bounds(year=2026, month=10)
    invoice_generate(tenant=tenant, period_start=start, period_end=end)
    market_reserve_set(market=market, reserve="0.01", user=None)
    return client


def admin_url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_model_is_in_the_admin(operator_client, model) -> None:
    assert admin.site.is_registered(model)
    assert operator_client.get(admin_url(model, "changelist")).status_code == 200
    obj = model.objects.first()
    assert obj is not None
    assert operator_client.get(admin_url(model, "change", obj.pk)).status_code == 200


@pytest.mark.parametrize("model", READ_ONLY, ids=lambda m: m.__name__)
def test_money_records_are_read_only_in_the_admin(operator_client, model) -> None:
    obj = model.objects.first()
    count = model.objects.count()
    assert operator_client.get(admin_url(model, "add")).status_code == 403
    assert operator_client.post(admin_url(model, "change", obj.pk), {}).status_code == 403
    assert (
        operator_client.post(admin_url(model, "delete", obj.pk), {"post": "yes"}).status_code == 403
    )
    assert model.objects.count() == count


def test_the_ledger_amount_cannot_be_edited(operator_client) -> None:
    entry = LedgerEntry.objects.get(request_id="r1", kind="priority")
    page = operator_client.get(admin_url(LedgerEntry, "change", entry.pk)).content.decode()
    assert 'name="amount"' not in page
    operator_client.post(admin_url(LedgerEntry, "change", entry.pk), {"amount": "0"})
    entry.refresh_from_db()
    assert entry.amount == Decimal("0.5")


def test_a_reserve_moved_in_the_admin_is_audited(
    operator_client, django_capture_on_commit_callbacks
) -> None:
    market = Market.objects.get(slug="test-llm")
    form = {
        "slug": market.slug,
        "name": market.name,
        "served_model": market.served_model,
        "price_input_per_mtok": "3",
        "price_cached_input_per_mtok": "0.3",
        "price_output_per_mtok": "15",
        "reserve": "0.02",
        "reserve_max": "1",
        "policy": market.policy,
        "engine_url": market.engine_url,
        "chat_template": market.chat_template,
        "max_wait_s": "60",
        "priority_ttft_s": "2",
        "priority_probability": "0.9",
        "auto_reserve_target_s": "2",
        "wait_bound_s": "20",
        "wait_bound_mode": "auto",
        "is_active": "on",
        "reserve_changes-TOTAL_FORMS": "0",
        "reserve_changes-INITIAL_FORMS": "0",
        "control_changes-TOTAL_FORMS": "0",
        "control_changes-INITIAL_FORMS": "0",
        # A replica added in the same form.
        "replicas-TOTAL_FORMS": "1",
        "replicas-INITIAL_FORMS": "0",
        "replicas-0-engine_id": "sim-a",
        "replicas-0-url": "http://127.0.0.1:30001",
        "replicas-0-enabled": "on",
    }
    with django_capture_on_commit_callbacks(execute=False) as queued:
        response = operator_client.post(admin_url(Market, "change", market.pk), form)
    assert response.status_code == 302, response.content.decode()[:2000]
    market.refresh_from_db()
    assert market.reserve == Decimal("0.02")
    (replica,) = market.replicas.all()
    assert (replica.engine_id, replica.url, replica.enabled) == (
        "sim-a", "http://127.0.0.1:30001", True
    )  # fmt: skip
    assert len(queued) == 2  # the reserve's push, and the replica's (it gets the values)
    latest = ReserveChange.objects.filter(market=market).first()
    assert (latest.old, latest.new, latest.changed_by.username) == (
        Decimal("0.01"),
        Decimal("0.02"),
        "root",
    )
    # The policy and a higher ceiling with a reserve above the old one, in one save: each goes
    # through its service (the ceiling first, which the reserve needs) and is audited.
    form = {**form, "replicas-TOTAL_FORMS": "0", "policy": "lpm", "reserve_max": "3",
            "reserve": "2", "wait_bound_mode": "pinned", "wait_bound_s": "25"}  # fmt: skip
    assert operator_client.post(admin_url(Market, "change", market.pk), form).status_code == 302
    market.refresh_from_db()
    assert (market.policy, market.reserve_max, market.reserve) == (
        "lpm",
        Decimal("3"),
        Decimal("2"),
    )
    audit = [(c.control, c.old, c.new, c.changed_by.username) for c in ControlChange.objects.all()]
    assert sorted(audit) == [
        ("policy", "dfs-auction-kv-split", "lpm", "root"),
        ("reserve_max", "1.000000000", "3.000000000", "root"),
        ("wait_bound_s", "20 (auto)", "25", "root"),
    ]
    # A reserve above the ceiling is a form error, not a 500: nothing changes.
    page = operator_client.post(admin_url(Market, "change", market.pk), {**form, "reserve": "4"})
    assert page.status_code == 200 and "Above the reserve ceiling" in page.content.decode()
    market.refresh_from_db()
    assert market.reserve == Decimal("2")
    # A wait bound out of range is a form error too.
    page = operator_client.post(
        admin_url(Market, "change", market.pk), {**form, "wait_bound_s": "0.1"}
    )
    assert page.status_code == 200 and "wait bound must be 0 (off)" in page.content.decode()
    assert Market.objects.get(pk=market.pk).wait_bound_s == 25.0
    # Off with a length, or on at 0 s, is a form error that says so.
    for mode, length in (("off", "25"), ("pinned", "0")):
        changed = {**form, "wait_bound_mode": mode, "wait_bound_s": length}
        page = operator_client.post(admin_url(Market, "change", market.pk), changed)
        assert page.status_code == 200, mode
        assert "A wait bound that is off is 0 s; one that is on is longer" in page.content.decode()
    # Back to automatic: the length in force stays until the next renewal moves it.
    auto = {**form, "wait_bound_mode": "auto", "wait_bound_s": "25"}
    assert operator_client.post(admin_url(Market, "change", market.pk), auto).status_code == 302
    market.refresh_from_db()
    assert (market.wait_bound_mode, market.wait_bound_s) == ("auto", 25.0)


def test_the_admin_shows_figures_by_the_one_rule(operator_client) -> None:
    """The issue saw the exposure factor as 0.0014224666666666666 and amounts with 9 places:
    three significant digits, money with its $, cents from $1 (accounts/figures.py)."""
    from accounts.models import Autobidder, AutobidderStep
    from accounts.services.autobidder import autobidder_configure

    tenant = Tenant.objects.get(slug="acme")
    auto = autobidder_configure(
        tenant=tenant, enabled=True, budget="12.5", values={"interactive": "0.01"}
    )
    Autobidder.objects.filter(pk=auto.pk).update(exposure_factor=0.0014224666666666666, mu=0.5)
    AutobidderStep.objects.create(
        autobidder=auto,
        at=datetime(2026, 10, 5, tzinfo=UTC),
        mu=1.23456,
        spent=Decimal("0.007840000"),
        target=Decimal("0.0000742"),
        window_spent=Decimal("9.264900000"),
        exposure_factor=0.0014224666666666666,
        in_flight=Decimal("0"),
        uncollected=Decimal("1234.565"),
    )
    listing = operator_client.get(admin_url(Autobidder, "changelist")).content.decode()
    assert "0.00142" in listing and "0.0014224666666666666" not in listing
    assert "$12.50" in listing
    change = operator_client.get(admin_url(Autobidder, "change", auto.pk)).content.decode()
    assert "0.00142" in change and "0.0014224666666666666" not in change
    assert 'name="mu"' not in change and 'name="exposure_factor"' not in change  # not editable
    steps = operator_client.get(admin_url(AutobidderStep, "changelist")).content.decode()
    for shown in ("1.23", "$0.00784", "$0.0000742", "$9.26", "$0.00", "$1,234.57", "0.00142"):
        assert f">{shown}<" in steps, shown
    ledger = operator_client.get(admin_url(LedgerEntry, "changelist")).content.decode()
    assert ">$0.50<" in ledger and "0.500000000" not in ledger  # the charge of 0.5 from spend()
    budgets = operator_client.get(admin_url(Budget, "changelist")).content.decode()
    assert ">$5.00<" in budgets


def test_the_admin_takes_a_latency_target_and_refuses_a_malformed_one(operator_client) -> None:
    """A class's latency target is set in the admin's values; p = 1 is a field error naming the
    class and the rule (0 < p < 1), and the saved settings stay as they were."""
    from accounts.models import Autobidder

    tenant = Tenant.objects.get(slug="acme")
    form = {
        "tenant": str(tenant.pk),
        "enabled": "on",
        "budget": "5",
        "period": "day",
        "values": '{"chat": {"ttft_s": 2, "p": 0.9}, "batch": "0.001"}',
        "max_wait_s": "60",
        "eta": "1",
        "mu_max": "1000",
        "spent_start_0": "2026-01-01",
        "spent_start_1": "00:00:00",
    }
    response = operator_client.post(admin_url(Autobidder, "add"), form)
    assert response.status_code == 302, response.content.decode()[:3000]
    auto = Autobidder.objects.get(tenant=tenant)
    assert auto.values == {"chat": {"ttft_s": 2.0, "p": 0.9}, "batch": "0.001000000"}
    bad = {**form, "values": '{"chat": {"ttft_s": 2, "p": 1}}'}
    page = operator_client.post(admin_url(Autobidder, "change", auto.pk), bad)
    assert page.status_code == 200
    assert "request class &#x27;chat&#x27;: p must lie strictly between 0 and 1" in (
        page.content.decode()
    )
    auto.refresh_from_db()
    assert auto.values["chat"] == {"ttft_s": 2.0, "p": 0.9}
