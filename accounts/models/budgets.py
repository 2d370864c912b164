"""Budgets and holds (DESIGN.md 4.6 and 6).

A budget caps what a tenant (or one of its API keys) may spend per period. The period's window
is computed from the clock when it is read (``accounts.windows``): there is no stored "spent"
counter and no reset job, so nothing can reset on top of fresh spend. Spend in a window is the
sum of the ledger entries created in it; a hold is money reserved for a request in flight.
"""

from decimal import Decimal

from django.db import models
from django.db.models import Q

from accounts.models.keys import ApiKey
from accounts.models.tenants import Tenant
from accounts.money import MoneyField


class Period(models.TextChoices):
    """How often a budget starts again at zero (UTC calendar windows)."""

    DAY = "day", "Day (from 00:00 UTC)"
    WEEK = "week", "Week (from Monday 00:00 UTC)"
    MONTH = "month", "Month (from the 1st, 00:00 UTC)"
    NONE = "none", "None (never resets)"


class Budget(models.Model):
    """A hard limit in dollars per period, for a tenant (``api_key`` null) or one of its keys.

    A request must fit every budget that applies to it: its tenant's and its key's.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budgets")
    api_key = models.OneToOneField(
        ApiKey, null=True, blank=True, on_delete=models.CASCADE, related_name="budget"
    )
    period = models.CharField(max_length=8, choices=Period.choices, default=Period.MONTH)
    limit = MoneyField(help_text="Hard limit, dollars per period.")
    soft_alert_fraction = models.DecimalField(
        max_digits=5,
        decimal_places=4,
        default=Decimal("0.8"),
        help_text="Alert once this fraction of the limit is spent (0 to 1).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant", "api_key"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant"],
                condition=Q(api_key__isnull=True),
                name="budget_one_per_tenant",
            ),
            models.CheckConstraint(condition=Q(limit__gte=0), name="budget_limit_not_negative"),
            models.CheckConstraint(
                condition=Q(soft_alert_fraction__gte=0) & Q(soft_alert_fraction__lte=1),
                name="budget_soft_alert_is_a_fraction",
            ),
        ]

    def __str__(self) -> str:
        owner = f"key {self.api_key.name}" if self.api_key_id else "tenant"
        return f"{self.tenant} {owner}: ${self.limit} per {self.period}"


class HoldState(models.TextChoices):
    OPEN = "open", "Open"  # the request is in flight; ``remaining`` is reserved
    SETTLED = "settled", "Settled"  # the request completed; its charges replaced the hold
    RELEASED = "released", "Released"  # the request failed; nothing more will be charged


class Hold(models.Model):
    """Money reserved for one request in flight, so concurrent requests cannot overspend.

    ``amount`` is the worst case placed by the gateway; ``remaining`` is what is still reserved
    (each charge settled against the request lowers it, never below 0). Closed holds reserve
    nothing.
    """

    request_id = models.CharField(max_length=200, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="holds")
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.CASCADE, related_name="holds"
    )
    amount = MoneyField(help_text="Dollars reserved when the hold was placed.")
    remaining = MoneyField(help_text="Dollars still reserved.")
    state = models.CharField(max_length=8, choices=HoldState.choices, default=HoldState.OPEN)
    created_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "state"], name="hold_tenant_state"),
            models.Index(fields=["api_key", "state"], name="hold_key_state"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(remaining__gte=0) & Q(amount__gte=0), name="hold_not_negative"
            )
        ]

    def __str__(self) -> str:
        return f"hold {self.request_id}: ${self.remaining} of ${self.amount} ({self.state})"
