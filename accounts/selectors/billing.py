"""Reads of a tenant's API keys and invoices (always scoped to one tenant)."""

from django.db.models import QuerySet

from accounts.models import ApiKey, Invoice, InvoiceLine, Tenant


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
        .select_related("market", "request")
        .order_by("market__slug", "request__created_at", "request_id")
    )
