"""Budgets, holds and the counters budgets are checked against (docs/ledger.md, "Budgets and
holds" and "The money rules"; the autobidder's budget: docs/mechanism.md, "The autobidder").

A budget caps what a tenant (or one of its API keys) may spend per period. The period's window
is computed from the clock (``accounts.windows``): spend in a window is the sum of the ledger
entries created in it; a hold is money reserved for a request in flight. So that a hold need not
sum the ledger, :class:`BudgetCounter` keeps those sums as the ledger is written; there is still
no reset job, so nothing can reset on top of fresh spend.
"""

from datetime import datetime
from decimal import Decimal

from django.db import models
from django.db.models import Q

from accounts import rules
from accounts.algebra import VALUES
from accounts.models.keys import ApiKey
from accounts.models.tenants import Tenant
from accounts.money import MoneyField, money_str
from accounts.windows import EPOCH, window_for


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
        return f"{self.tenant} {owner}: ${money_str(self.limit)} per {self.period}"


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
    # tenant, api_key: indexed as the leading column of hold_tenant_state and hold_key_state
    # (an index of their own would only cost every hold's insert and close).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="holds", db_index=False
    )
    api_key = models.ForeignKey(
        ApiKey,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="holds",
        db_index=False,
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
        return (
            f"hold {self.request_id}: ${money_str(self.remaining)} of ${money_str(self.amount)} "
            f"({self.state})"
        )


WINDOWED_PERIODS = ("day", "week", "month")  # the periods whose windows end ("none" never does)


class BudgetCounter(models.Model):
    """What a tenant (``api_key`` null: all of its requests) or one of its API keys has spent and
    holds, kept in step with the ledger and the holds: a hold is checked against one row per
    budget instead of a sum over the ledger.

    There is a row per tenant and per key that has made requests, whether or not a budget
    applies, so a budget set later, or switched to another period, reads the right spend at once.
    Every ledger entry and every change of an open hold updates the rows of its tenant and key
    in the same transaction (``accounts.ledger.statements``).

    For each period the row keeps the spend of one window: the newest that a charge has fallen
    in (its ``*_start`` is computed from the charge's time, ``accounts.windows``). A charge in a
    newer window starts that window's sum at its own amount, a charge in an older window leaves
    it alone, and no entry lies in a window newer than the row's: the windows that follow have
    spent nothing yet, and only windows older than the row's need the ledger
    (:meth:`spent_in`). Holds are not windowed: a request in flight keeps its money reserved
    across a reset.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budget_counters")
    api_key = models.OneToOneField(
        ApiKey, null=True, blank=True, on_delete=models.CASCADE, related_name="budget_counter"
    )
    held = MoneyField(default=0, help_text="Dollars reserved by open holds.")
    spent_total = MoneyField(default=0, help_text="Dollars charged, ever (period none).")
    day_start = models.DateTimeField(default=EPOCH)
    day_spent = MoneyField(default=0, help_text="Dollars charged in the day from day_start.")
    week_start = models.DateTimeField(default=EPOCH)
    week_spent = MoneyField(default=0, help_text="Dollars charged in the week from week_start.")
    month_start = models.DateTimeField(default=EPOCH)
    month_spent = MoneyField(default=0, help_text="Dollars charged in the month from month_start.")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant"],
                condition=Q(api_key__isnull=True),
                name="budget_counter_one_per_tenant",
            ),
            models.CheckConstraint(
                condition=Q(held__gte=0)
                & Q(spent_total__gte=0)
                & Q(day_spent__gte=0)
                & Q(week_spent__gte=0)
                & Q(month_spent__gte=0),
                name="budget_counter_not_negative",
            ),
        ]

    def __str__(self) -> str:
        owner = f"key {self.api_key_id}" if self.api_key_id else "tenant"
        return (
            f"{self.tenant_id} {owner}: ${money_str(self.spent_total)} spent, "
            f"${money_str(self.held)} held"
        )

    def spent_in(
        self, *, period: str, window_start: datetime, at_most: bool = False
    ) -> Decimal | None:
        """Dollars charged in the ``period`` window that starts at ``window_start``; None when
        that window is older than the one this row keeps (sum the ledger for it), or with
        ``at_most`` the row's window's: the most it can have spent (``rules.window_spent``,
        ``rules.window_spent_at_most``)."""

        if period == "none":
            return self.spent_total
        rule = rules.window_spent_at_most if at_most else rules.window_spent
        return rule(
            VALUES,
            kept_start=getattr(self, f"{period}_start"),
            kept_spent=getattr(self, f"{period}_spent"),
            start=window_start,
        )

    def charge_counted(self, *, amount: Decimal, at: datetime) -> None:
        """Count a charge of ``amount`` dollars made at ``at`` (its ledger entry's time) in
        every window (``rules.window_counted``); the caller saves."""

        self.spent_total += amount
        for period in WINDOWED_PERIODS:
            start, spent = rules.window_counted(
                VALUES,
                kept_start=getattr(self, f"{period}_start"),
                kept_spent=getattr(self, f"{period}_spent"),
                start=window_for(period=period, now=at).start,
                amount=amount,
            )
            setattr(self, f"{period}_start", start)
            setattr(self, f"{period}_spent", spent)
