"""Tenants (the customers of the market) and their members' roles.

Operators are Django staff users and belong to no tenant. Tenant members are ordinary users
linked through :class:`Membership`, whose role says what they may do in their tenant.
"""

from decimal import Decimal

from django.conf import settings
from django.db import models

from accounts.money import MoneyField


class Tenant(models.Model):
    """A customer account: its members' programs send requests and are charged for them."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=50, unique=True)
    priority_bid_cap = MoneyField(
        default=Decimal("0.01"),
        help_text="Dollars per second of waiting: the most a request of service tier "
        "'priority', or of an autobidder class with a latency target, bids, whatever the "
        "market's quote.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="tenants", blank=True
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Role(models.TextChoices):
    """What a member may do in their tenant."""

    ADMIN = "tenant_admin", "Tenant admin"  # manages API keys, reads everything of the tenant
    VIEWER = "tenant_viewer", "Tenant viewer"  # reads only


class Membership(models.Model):
    """A user's membership of a tenant, with a role."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    # The least privilege unless said otherwise.
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"
