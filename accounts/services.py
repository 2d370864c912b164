"""Writes about tenants, and the demo data ``make run`` starts with."""

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django.db import transaction

from accounts.models import Membership, Tenant


@dataclass(frozen=True)
class DemoLogin:
    """A demo account and its fixed password (printed by ``seed_demo``; demo only)."""

    username: str
    password: str
    role: str  # "operator" or "tenant <slug>"


DEMO_OPERATOR = DemoLogin("operator", "operator-demo-pass", "operator")
# (tenant name, tenant slug, its admin's login)
DEMO_TENANTS = (
    ("Acme Corp", "acme", DemoLogin("acme-admin", "acme-demo-pass", "tenant acme")),
    ("Globex Inc", "globex", DemoLogin("globex-admin", "globex-demo-pass", "tenant globex")),
)


def tenant_ensure(*, name: str, slug: str) -> Tenant:
    """The tenant with ``slug``, created with ``name`` if missing (an existing one is kept)."""
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name})
    return tenant


def membership_ensure(*, tenant: Tenant, user: AbstractUser) -> Membership:
    """Make ``user`` a member of ``tenant`` (no-op when already one)."""
    membership, _ = Membership.objects.get_or_create(tenant=tenant, user=user)
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
    """Create the demo operator, the demo tenants and their admins. Idempotent."""
    _demo_user_ensure(login=DEMO_OPERATOR, operator=True)
    logins = [DEMO_OPERATOR]
    for name, slug, login in DEMO_TENANTS:
        tenant = tenant_ensure(name=name, slug=slug)
        membership_ensure(tenant=tenant, user=_demo_user_ensure(login=login, operator=False))
        logins.append(login)
    return logins
