"""Invoices: a tenant's ledger entries of one period, a line per request with both parts."""

from django.db import models
from django.db.models import Q

from accounts.models.ledger import Request
from accounts.models.tenants import Tenant
from accounts.money import MoneyField, money_str


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
