"""Tenants: the customers of the market.

Operators are Django staff users and belong to no tenant. Tenant members are ordinary users
linked through :class:`Membership`. Provisional: a later issue adds roles, API keys, budgets and
the ledger; the membership table is where roles will live.
"""

from django.conf import settings
from django.db import models


class Tenant(models.Model):
    """A customer account: its members' programs send requests and are charged for them."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=50, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="tenants", blank=True
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user's membership of a tenant (provisional: no roles yet)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant}"
