"""Reads about tenants."""

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from accounts.models import Tenant


def tenants_for_user(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[Tenant]:
    """The tenants ``user`` is a member of (none for anonymous users and pure operators)."""
    if not user.is_authenticated:
        return Tenant.objects.none()
    return Tenant.objects.filter(memberships__user=user).order_by("name")
