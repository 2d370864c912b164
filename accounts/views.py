"""Tenant pages: budgets, API keys and invoices (HTML, CSV, PDF). Thin: logic lives in the
services and selectors.

Who sees what: operators (staff) every tenant, members their own tenants, nobody else any. A
tenant (or an object of a tenant) someone may not see answers 404, so its existence does not
leak; a viewer trying to change something of their own tenant gets 403. The list of tenants
(``/tenants/``) shows each user the tenants they may see: every one to operators, their own to
members, none to others.
"""

from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.exports import invoice_csv, invoice_pdf
from accounts.forms import ApiKeyCreateForm
from accounts.models import ApiKey, Invoice, Tenant
from accounts.selectors import (
    api_key_for_tenant,
    api_keys_for_tenant,
    budget_status,
    budget_statuses_for_tenant,
    can_manage_keys,
    invoice_breakdown,
    invoice_for_tenant,
    invoices_for_tenant,
    role_for_user,
    tenant_for_user,
)
from accounts.selectors.tenants import tenants_visible_to
from accounts.services import api_key_create, api_key_revoke

TenantView = Callable[..., HttpResponse]


def tenant_page(view: TenantView) -> Callable[..., HttpResponse]:
    """Log in first (redirect), then resolve ``slug`` to a tenant the user may see, else 404."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, slug: str, **kwargs: object) -> HttpResponse:
        try:
            tenant = tenant_for_user(user=request.user, slug=slug)
        except Tenant.DoesNotExist:
            raise Http404("No such tenant") from None
        return view(request, tenant, **kwargs)

    return wrapper


def _invoice_or_404(tenant: Tenant, invoice_id: int) -> Invoice:
    try:
        return invoice_for_tenant(tenant=tenant, invoice_id=invoice_id)
    except Invoice.DoesNotExist:
        raise Http404("No such invoice") from None


@require_GET
@login_required
def tenant_list(request: HttpRequest) -> HttpResponse:
    """The tenants the user may see (every one for operators), each with its budget and links
    to its dashboard, invoices, API keys and budgets."""
    rows = [(t, budget_status(tenant=t)) for t in tenants_visible_to(user=request.user)]
    return render(request, "accounts/tenant_list.html", {"rows": rows})


@require_GET
@tenant_page
def tenant_home(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """A tenant's budgets at a glance, with links to its keys and invoices."""
    context = {
        "tenant": tenant,
        "role": role_for_user(user=request.user, tenant=tenant),
        "budgets": budget_statuses_for_tenant(tenant=tenant),
    }
    return render(request, "accounts/tenant_home.html", context)


@require_GET
@tenant_page
def invoice_list(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    invoices = invoices_for_tenant(tenant=tenant)
    return render(request, "accounts/invoice_list.html", {"tenant": tenant, "invoices": invoices})


@require_GET
@tenant_page
def invoice_detail(request: HttpRequest, tenant: Tenant, invoice_id: int) -> HttpResponse:
    invoice = _invoice_or_404(tenant, invoice_id)
    breakdown = invoice_breakdown(invoice=invoice)
    context = {
        "tenant": tenant,
        "invoice": invoice,
        "breakdown": breakdown,
        "summaries": [
            ("By day (UTC)", "Date", breakdown.by_day),
            ("By API key", "API key", breakdown.by_key),
            ("By market", "Market", breakdown.by_market),
        ],
        "issuer_name": settings.INVOICE_ISSUER_NAME,
    }
    return render(request, "accounts/invoice_detail.html", context)


@require_GET
@tenant_page
def invoice_csv_download(request: HttpRequest, tenant: Tenant, invoice_id: int) -> HttpResponse:
    invoice = _invoice_or_404(tenant, invoice_id)
    response = HttpResponse(invoice_csv(invoice), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{invoice.number}.csv"'
    return response


@require_GET
@tenant_page
def invoice_pdf_download(request: HttpRequest, tenant: Tenant, invoice_id: int) -> HttpResponse:
    invoice = _invoice_or_404(tenant, invoice_id)
    response = HttpResponse(invoice_pdf(invoice), content_type="application/pdf")
    response["Content-Disposition"] = f'attachment; filename="{invoice.number}.pdf"'
    return response


@require_http_methods(["GET", "POST"])
@tenant_page
def api_key_list(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """The tenant's keys; a POST creates one and shows its secret on this response only."""
    may_manage = can_manage_keys(user=request.user, tenant=tenant)
    form = ApiKeyCreateForm()
    new_key = new_secret = None
    if request.method == "POST":
        if not may_manage:
            raise PermissionDenied("Only the tenant's admins manage its API keys.")
        form = ApiKeyCreateForm(request.POST)
        if form.is_valid():
            new_key, new_secret = api_key_create(
                tenant=tenant, created_by=request.user, **form.cleaned_data
            )
            form = ApiKeyCreateForm()
    context = {
        "tenant": tenant,
        "keys": api_keys_for_tenant(tenant=tenant),
        "may_manage": may_manage,
        "form": form,
        "new_key": new_key,
        "new_secret": new_secret,
    }
    response = render(request, "accounts/api_keys.html", context)
    response["Cache-Control"] = "no-store"  # the page may carry a secret
    return response


@require_POST
@tenant_page
def api_key_revoke_view(request: HttpRequest, tenant: Tenant, key_id: int) -> HttpResponse:
    try:
        api_key = api_key_for_tenant(tenant=tenant, key_id=key_id)
    except ApiKey.DoesNotExist:
        raise Http404("No such key") from None
    if not can_manage_keys(user=request.user, tenant=tenant):
        raise PermissionDenied("Only the tenant's admins manage its API keys.")
    api_key_revoke(api_key=api_key)
    return redirect("accounts:api_keys", slug=tenant.slug)
