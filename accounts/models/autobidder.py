"""A tenant's autobidder: its settings, its multiplier, and the multiplier's past (the rules:
docs/mechanism.md, "The autobidder").

The autobidder bids for the tenant's requests that carry no explicit bid: value / (1 + mu) for
the request's class, capped so that the worst case (bid x max_wait_s) fits what is left of its
budget. Its budget covers the priority charges of the requests it bid for; a periodic task
(``autobidder_step``) moves mu by one gradient step per interval. The pacing itself is
``mechanism.pacing.PacingAgent``; this model only stores its state between steps.
"""

from datetime import datetime
from decimal import Decimal

from django.db import models
from django.db.models import Q

from accounts import rules
from accounts.algebra import VALUES
from accounts.models.tenants import Tenant
from accounts.money import ZERO, MoneyField
from accounts.windows import EPOCH, window_for


class AutobidPeriod(models.TextChoices):
    """Budget periods the autobidder paces over (UTC calendar windows; no "none")."""

    DAY = "day", "Day"
    WEEK = "week", "Week"
    MONTH = "month", "Month"


class Autobidder(models.Model):
    """One tenant's autobidder settings and current multiplier."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="autobidder")
    enabled = models.BooleanField(default=False)
    budget = MoneyField(default=0, help_text="Priority dollars per period for autobid requests.")
    period = models.CharField(
        max_length=8, choices=AutobidPeriod.choices, default=AutobidPeriod.DAY
    )
    values = models.JSONField(
        default=dict,
        help_text='Value per request class, dollars per second of waiting, e.g. {"interactive": '
        '"0.05", "background": "0.001"}.',
    )
    max_wait_s = models.FloatField(
        default=60.0, help_text="Bound on a request's planned wait, seconds; holds bid x this."
    )
    eta = models.FloatField(
        default=1.0,
        help_text="eta0: each pacing step moves log(1 + mu) by eta0 / sqrt(steps per window) x "
        "the relative overspend (unitless).",
    )
    mu_max = models.FloatField(
        default=1000.0,
        help_text="Ceiling on the multiplier's bound, which each step derives from the values, "
        "the request rate and the budget's rate.",
    )
    mu = models.FloatField(
        default=0.0,
        help_text="Current multiplier: bids are value / (1 + mu). Kept from one window to the "
        "next (the warm start).",
    )
    exposure_factor = models.FloatField(
        default=1.0,
        help_text="A high quantile of charge / worst case over recent autobid requests: the "
        "share of their worst case that the requests in flight are reserved for.",
    )
    # What its budget has paid in one window, kept as the ledger is written (like a
    # BudgetCounter), so that settlement checks a priority charge against it with the row locked.
    spent_start = models.DateTimeField(default=EPOCH, help_text="Start of the window counted.")
    spent_in_window = MoneyField(
        default=0, help_text="Priority dollars charged to autobid requests since spent_start."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(mu__gte=0), name="autobidder_mu_not_negative"),
            models.CheckConstraint(condition=Q(max_wait_s__gt=0), name="autobidder_wait_positive"),
        ]

    def __str__(self) -> str:
        return f"autobidder of {self.tenant}"

    def window_spent(self, *, now: datetime) -> Decimal:
        """Priority dollars its budget has paid in its window at ``now``: the counted window's
        spend, 0 when that window has ended, the counted one's when ``now`` lies before it
        (``rules.window_spent_at_most``)."""

        return rules.window_spent_at_most(
            VALUES,
            kept_start=self.spent_start,
            kept_spent=self.spent_in_window,
            start=window_for(period=self.period, now=now).start,
        )

    def budget_left(self, *, now: datetime) -> Decimal:
        """Dollars its budget has left in its window at ``now`` (negative if a limit was
        lowered below what was spent; ``rules.left``, nothing held)."""

        return rules.left(VALUES, limit=self.budget, spent=self.window_spent(now=now), held=ZERO)

    def charge_counted(self, *, amount: Decimal, at: datetime) -> None:
        """Count a priority charge of ``amount`` dollars made at ``at`` (``rules.window_counted``,
        BudgetCounter's rule); the caller saves."""

        self.spent_start, self.spent_in_window = rules.window_counted(
            VALUES,
            kept_start=self.spent_start,
            kept_spent=self.spent_in_window,
            start=window_for(period=self.period, now=at).start,
            amount=amount,
        )


class AutobidderStep(models.Model):
    """One pacing step: the multiplier after it and the spend it reacted to (for the dashboard)."""

    autobidder = models.ForeignKey(Autobidder, on_delete=models.CASCADE, related_name="steps")
    at = models.DateTimeField()
    mu = models.FloatField()
    spent = MoneyField(help_text="Priority dollars spent by autobid requests in the interval.")
    target = MoneyField(help_text="What the interval should have spent to pace the budget.")
    window_spent = MoneyField(help_text="Spent so far in the budget window, dollars.")
    exposure_factor = models.FloatField(default=1.0, help_text="The exposure factor after it.")
    in_flight = MoneyField(
        default=0, help_text="Worst cases of the autobid requests not settled yet, dollars."
    )
    uncollected = MoneyField(
        default=0,
        help_text="Priority charges the budget cut in the window so far (given away), dollars.",
    )

    class Meta:
        ordering = ["autobidder", "at"]
        indexes = [models.Index(fields=["autobidder", "at"], name="autobid_step_time")]
