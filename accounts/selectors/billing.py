"""Reads of a tenant's API keys and invoices (always scoped to one tenant), and an invoice's
lines summed by day, by API key and by market (what its PDF and page show)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date
from decimal import Decimal

from django.db.models import Min, QuerySet

from accounts.models import ApiKey, Invoice, InvoiceLine, LedgerEntry, Tenant
from accounts.money import ZERO

# The API key column of a request sent without one (from the console: a batch uploaded there).
NO_KEY = "console / no key"


def api_keys_for_tenant(*, tenant: Tenant) -> QuerySet[ApiKey]:
    """The tenant's keys, newest first, with their budgets."""
    return ApiKey.objects.filter(tenant=tenant).select_related("budget").order_by("-created_at")


def api_key_for_tenant(*, tenant: Tenant, key_id: int) -> ApiKey:
    """Key ``key_id`` of ``tenant``; ApiKey.DoesNotExist when it is another tenant's."""
    return ApiKey.objects.get(tenant=tenant, pk=key_id)


def invoices_for_tenant(*, tenant: Tenant) -> QuerySet[Invoice]:
    """The tenant's invoices, latest period first."""
    return Invoice.objects.filter(tenant=tenant).select_related("tenant").order_by("-period_start")


def invoice_for_tenant(*, tenant: Tenant, invoice_id: int) -> Invoice:
    """Invoice ``invoice_id`` of ``tenant``; Invoice.DoesNotExist when it is another tenant's."""
    return Invoice.objects.select_related("tenant").get(tenant=tenant, pk=invoice_id)


def invoice_lines(*, invoice: Invoice) -> QuerySet[InvoiceLine]:
    """The invoice's lines by market, then by request time."""
    return (
        InvoiceLine.objects.filter(invoice=invoice)
        .select_related("market", "request", "request__api_key")
        .order_by("market__slug", "request__created_at", "request_id")
    )


@dataclass
class UsageSum:
    """What some of an invoice's lines add up to: requests, tokens and dollars (exact).

    The token counts mean what the CSV's columns of the same names mean: ``prompt_tokens`` all
    prompt tokens, ``cached_tokens`` those of them that were cached, ``completion_tokens``.
    """

    label: str
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    priority: Decimal = ZERO
    tokens: Decimal = ZERO

    @property
    def total(self) -> Decimal:
        return self.priority + self.tokens

    def add(self, line: InvoiceLine) -> None:
        self.requests += 1
        self.prompt_tokens += line.prompt_tokens
        self.cached_tokens += line.cached_tokens
        self.completion_tokens += line.completion_tokens
        self.priority += line.priority_amount
        self.tokens += line.tokens_amount


@dataclass(frozen=True)
class InvoiceBreakdown:
    """An invoice's lines and their sums: per UTC day (chronological), per API key (by label,
    requests without a key last), per market (by slug), and over all lines."""

    lines: list[InvoiceLine]
    by_day: list[UsageSum]
    by_key: list[UsageSum]
    by_market: list[UsageSum]
    total: UsageSum


def usage_sums(
    lines: Iterable[InvoiceLine],
    *,
    label: Callable[[InvoiceLine], str],
    order: Callable[[str], object] = lambda text: text,
) -> list[UsageSum]:
    """The sums of ``lines`` grouped by ``label(line)``, sorted by ``order(label)``."""
    sums: dict[str, UsageSum] = {}
    for line in lines:
        name = label(line)
        sums.setdefault(name, UsageSum(label=name)).add(line)
    return [sums[name] for name in sorted(sums, key=order)]


def invoice_charge_days(*, invoice: Invoice) -> dict[str, date]:
    """The UTC day each request of ``invoice`` was charged on (its first ledger entry in the
    period), by request id: the day an invoice's day summary counts it in, always within the
    period (a request opened before midnight and charged after counts on the later day)."""
    first = (
        LedgerEntry.objects.filter(
            tenant_id=invoice.tenant_id,
            created_at__gte=invoice.period_start,
            created_at__lt=invoice.period_end,
        )
        .values("request_id")
        .annotate(first=Min("created_at"))
        .values_list("request_id", "first")
    )
    return {request_id: at.astimezone(UTC).date() for request_id, at in first}


def usage_by_market(lines: Iterable[InvoiceLine]) -> list[UsageSum]:
    """The sums of ``lines`` per market, by slug."""
    return usage_sums(lines, label=lambda line: line.market.slug)


def _key_label(line: InvoiceLine) -> str:
    key = line.request.api_key
    return NO_KEY if key is None else f"{key.name} ({key.display})"


def invoice_breakdown(*, invoice: Invoice) -> InvoiceBreakdown:
    """``invoice``'s lines summed by day, by API key and by market (:class:`InvoiceBreakdown`)."""
    lines = list(invoice_lines(invoice=invoice))
    days = invoice_charge_days(invoice=invoice)

    def day(line: InvoiceLine) -> str:
        # Every line has an entry in the period; the request's own day only if one went missing.
        charged = days.get(line.request_id) or line.request.created_at.astimezone(UTC).date()
        return charged.isoformat()

    total = UsageSum(label="Total")
    for line in lines:
        total.add(line)
    return InvoiceBreakdown(
        lines=lines,
        by_day=usage_sums(lines, label=day),
        by_key=usage_sums(lines, label=_key_label, order=lambda text: (text == NO_KEY, text)),
        by_market=usage_by_market(lines),
        total=total,
    )
