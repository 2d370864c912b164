"""Markets (one per served model) and the audit trail of their reserve prices.

Money columns are exact ``Decimal`` dollars with 9 places (``accounts.money``): posted token
prices in dollars per million tokens, the reserve in dollars per second of waiting.
"""

from django.conf import settings
from django.db import models

from accounts.money import MoneyField
from market.mechanism import POLICIES

DEFAULT_POLICY = "dfs-auction-density"


class Market(models.Model):
    """One served model: its posted token prices, its reserve price and its ordering policy."""

    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=200)
    served_model = models.CharField(
        max_length=200, help_text="The model name the engine serves (the API's `model`)."
    )
    price_input_per_mtok = MoneyField(
        help_text="Dollars per million uncached prompt tokens.", default=0
    )
    price_cached_input_per_mtok = MoneyField(
        help_text="Dollars per million prompt tokens already in the KV cache.", default=0
    )
    price_output_per_mtok = MoneyField(
        help_text="Dollars per million completion tokens.", default=0
    )
    reserve = MoneyField(
        default=0,
        help_text="Reserve price, dollars per second of waiting: lower bids buy no priority.",
    )
    policy = models.CharField(
        max_length=32, choices=[(p, p) for p in POLICIES], default=DEFAULT_POLICY
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(price_input_per_mtok__gte=0)
                & models.Q(price_cached_input_per_mtok__gte=0)
                & models.Q(price_output_per_mtok__gte=0)
                & models.Q(reserve__gte=0),
                name="market_amounts_not_negative",
            )
        ]

    def __str__(self) -> str:
        return self.slug


class ReserveChange(models.Model):
    """Who moved a market's reserve price, from what, to what, and when (dollars per second)."""

    market = models.ForeignKey(Market, on_delete=models.CASCADE, related_name="reserve_changes")
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    old = MoneyField()
    new = MoneyField()
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.market}: {self.old} -> {self.new}"
