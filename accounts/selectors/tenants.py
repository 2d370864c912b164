"""Reads about tenants, and who may see or change what of them.

Operators (staff) see every tenant; a member sees their own tenants; nobody else sees any.
A tenant someone may not see does not exist for them (callers answer 404, so existence does
not leak).
"""

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from accounts.models import Membership, Role, Tenant

User = AbstractBaseUser | AnonymousUser
OPERATOR = "operator"


def tenants_for_user(*, user: User) -> QuerySet[Tenant]:
    """The tenants ``user`` is a member of (none for anonymous users and pure operators)."""
    if not user.is_authenticated:
        return Tenant.objects.none()
    return Tenant.objects.filter(memberships__user=user).order_by("name")


def tenants_visible_to(*, user: User) -> QuerySet[Tenant]:
    """Every tenant for operators, the user's own tenants for members, none for others."""
    if not user.is_authenticated or not user.is_active:
        return Tenant.objects.none()
    if user.is_staff:
        return Tenant.objects.order_by("name")
    return tenants_for_user(user=user)


def tenant_for_user(*, user: User, slug: str) -> Tenant:
    """The tenant ``slug`` if ``user`` may see it; Tenant.DoesNotExist otherwise."""
    return tenants_visible_to(user=user).get(slug=slug)


def role_for_user(*, user: User, tenant: Tenant) -> str | None:
    """``"operator"``, the user's membership role in ``tenant``, or None."""
    if not user.is_authenticated or not user.is_active:
        return None
    if user.is_staff:
        return OPERATOR
    return (
        Membership.objects.filter(tenant=tenant, user=user).values_list("role", flat=True).first()
    )


def can_manage_keys(*, user: User, tenant: Tenant) -> bool:
    """Operators and the tenant's admins may create and revoke its API keys."""
    return role_for_user(user=user, tenant=tenant) in (OPERATOR, Role.ADMIN)
