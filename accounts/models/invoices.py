"""Invoices: a tenant's ledger entries of one period, a line per request with both parts."""

from datetime import UTC, date, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import Q

from accounts.models.ledger import Request
from accounts.models.tenants import Tenant
from accounts.money import MoneyField, cents, money_str


class Invoice(models.Model):
    """What a tenant owes for the ledger entries created in [period_start, period_end)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="invoices")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    priority_total = MoneyField()
    tokens_total = MoneyField()
    total = MoneyField()
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["tenant", "-period_start"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "period_start", "period_end"], name="invoice_one_per_period"
            ),
            models.CheckConstraint(
                condition=Q(period_end__gt=models.F("period_start")), name="invoice_period_order"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant} {self.period_start:%Y-%m-%d}..{self.period_end:%Y-%m-%d}"

    @property
    def number(self) -> str:
        """A readable invoice number."""
        return f"INV-{self.tenant.slug}-{self.period_start:%Y%m%d}-{self.pk}"

    @property
    def total_due(self) -> Decimal:
        """What the tenant pays, dollars: the exact total rounded once to the cent, half up
        (:func:`accounts.money.cents`)."""
        return cents(self.total)

    @property
    def period_first_day(self) -> date:
        """The UTC day the period starts on."""
        return self.period_start.astimezone(UTC).date()

    @property
    def period_last_day(self) -> date:
        """The last UTC day of the period (its end is exclusive: a month ends at the next 1st)."""
        return (self.period_end.astimezone(UTC) - timedelta(microseconds=1)).date()

    @property
    def issued_on(self) -> date:
        """The UTC day the invoice was made."""
        return self.created_at.astimezone(UTC).date()

    @property
    def due_on(self) -> date:
        """The day payment is due: ``INVOICE_DUE_DAYS`` after the issue date. Computed when read,
        not stored: a PDF already sent keeps the date printed on it, one made after the setting
        changed shows the new one."""
        return self.issued_on + timedelta(days=settings.INVOICE_DUE_DAYS)


class InvoiceLine(models.Model):
    """One request's charges within an invoice's period (dollars)."""

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    request = models.ForeignKey(Request, on_delete=models.PROTECT, related_name="+")
    market = models.ForeignKey("market.Market", on_delete=models.PROTECT, related_name="+")
    round_id = models.CharField(max_length=200, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    priority_amount = MoneyField()
    tokens_amount = MoneyField()
    total = MoneyField()

    class Meta:
        ordering = ["invoice", "market", "request__created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["invoice", "request"], name="invoice_line_per_request")
        ]

    def __str__(self) -> str:
        return f"{self.request.request_id}: ${money_str(self.total)}"
