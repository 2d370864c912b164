"""``seed_demo``: the demo operator and tenants, idempotent, with logins that work."""

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from accounts.models import Budget, Membership, Role, Tenant
from market.models import Market

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
