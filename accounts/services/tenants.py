"""Writes about tenants and members, and the demo accounts ``make run`` starts with."""

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django.db import transaction

from accounts.models import Autobidder, Budget, Membership, Period, Role, Tenant
from accounts.money import money_exact
from accounts.services.autobidder import autobidder_configure


@dataclass(frozen=True)
class DemoLogin:
    """A demo account and its fixed password (printed by ``seed_demo``; demo only)."""

    username: str
    password: str
    role: str  # "operator" or "tenant <slug>"


DEMO_OPERATOR = DemoLogin("operator", "operator-demo-pass", "operator")
# Each demo tenant's monthly budget, dollars (created once; operators may change it later).
DEMO_MONTHLY_BUDGET = "50.000000000"
# (tenant name, tenant slug, its admin's login)
DEMO_TENANTS = (
    ("Acme Corp", "acme", DemoLogin("acme-admin", "acme-demo-pass", "tenant acme")),
    ("Globex Inc", "globex", DemoLogin("globex-admin", "globex-demo-pass", "tenant globex")),
)


# The demo's autobidder (``demo_accounts_seed``): Globex's requests send no bid (the demo agents'
# ``--autobid globex``), so it bids for them, its interactive ones worth what Acme's interactive
# users bid (about 0.05 $/s), within a budget of $1 a day: 0.07 cents a minute, below what its
# requests' priority charges cost at those values in the demo's queues, so that the budget
# binds and Globex's dashboard shows mu rise and the spend keep to the even pace.
DEMO_AUTOBID_TENANT = "globex"
DEMO_AUTOBIDDER = {
    "budget": "1",
    "period": "day",
    "values": {"interactive": "0.05", "background": "0.005"},
    "max_wait_s": 30.0,
}


def tenant_ensure(*, name: str, slug: str) -> Tenant:
    """The tenant with ``slug``, created with ``name`` if missing (an existing one is kept)."""
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name})
    return tenant


def membership_ensure(*, tenant: Tenant, user: AbstractUser, role: str = Role.VIEWER) -> Membership:
    """Make ``user`` a member of ``tenant`` with ``role`` (no write when it already is one)."""
    if role not in Role.values:
        raise ValueError(f"unknown role {role!r}")
    membership, created = Membership.objects.get_or_create(
        tenant=tenant, user=user, defaults={"role": role}
    )
    if not created and membership.role != role:
        membership.role = role
        membership.save(update_fields=["role"])
    return membership


def _demo_user_ensure(*, login: DemoLogin, operator: bool) -> AbstractUser:
    """Create or repair a demo user so that ``login`` works; an unchanged user is not saved."""
    user, _ = get_user_model().objects.get_or_create(username=login.username)
    changed = False
    if user.is_staff != operator or user.is_superuser != operator or not user.is_active:
        user.is_staff = user.is_superuser = operator
        user.is_active = True
        changed = True
    # Only reset the password when it no longer matches: re-hashing would change the row
    # (a new salt) on every run, and seeding twice must change nothing.
    if not user.check_password(login.password):
        user.set_password(login.password)
        changed = True
    if changed:
        user.save()
    return user


@transaction.atomic
def demo_accounts_seed() -> list[DemoLogin]:
    """Create the demo operator, the demo tenants, their admins and budgets, and Globex's
    autobidder (``DEMO_AUTOBIDDER``). Idempotent."""
    _demo_user_ensure(login=DEMO_OPERATOR, operator=True)
    logins = [DEMO_OPERATOR]
    for name, slug, login in DEMO_TENANTS:
        tenant = tenant_ensure(name=name, slug=slug)
        user = _demo_user_ensure(login=login, operator=False)
        membership_ensure(tenant=tenant, user=user, role=Role.ADMIN)
        Budget.objects.get_or_create(
            tenant=tenant,
            api_key=None,
            defaults={"limit": money_exact(DEMO_MONTHLY_BUDGET), "period": Period.MONTH},
        )
        logins.append(login)
    autobid = Tenant.objects.get(slug=DEMO_AUTOBID_TENANT)
    if not Autobidder.objects.filter(tenant=autobid).exists():  # kept as an operator left it
        autobidder_configure(tenant=autobid, enabled=True, **DEMO_AUTOBIDDER)  # type: ignore[arg-type]
    return logins
