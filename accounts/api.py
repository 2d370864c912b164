"""The tenant JSON API for browsers (logged-in session; CSRF applies to POSTs).

The same rules as the pages: 401 when not logged in, 404 for a tenant or object the user may
not see, 403 when a viewer tries to change something, 400 for a body or parameter that is not
acceptable (text with a NUL or a lone surrogate, ``accounts.text``, names its field). Amounts
are exact decimal strings (dollars).
"""

import json
from collections.abc import Callable
from datetime import timedelta
from functools import wraps

from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.exports import invoice_json
from accounts.forms import ApiKeyCreateForm
from accounts.models import ApiKey, Invoice, Tenant
from accounts.money import money_str
from accounts.selectors import (
    api_key_for_tenant,
    api_keys_for_tenant,
    budget_statuses_for_tenant,
    can_manage_keys,
    charges_by_market,
    invoice_for_tenant,
    invoices_for_tenant,
    spend_per_hour,
    tenant_for_user,
    top_requests_by_priority,
)
from accounts.services import api_key_create, api_key_revoke
from accounts.text import json_problem, whole_number

MAX_USAGE_HOURS = 24 * 31


def _error(status: int, message: str, **extra: object) -> JsonResponse:
    return JsonResponse({"error": message, **extra}, status=status)


def _json_form(raw: bytes) -> dict | JsonResponse:
    """A JSON body's fields (nulls dropped), or the 400 that says what is wrong with it."""
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested past Python's limit
        return _error(400, "the body is not JSON")
    if not isinstance(body, dict):
        return _error(400, "the body must be a JSON object")
    problem = json_problem(body)
    if problem is not None:
        where, why = problem
        field = where or "body"
        return _error(400, f"{field} {why}", fields={field: [why]})
    return {k: v for k, v in body.items() if v is not None}


def tenant_api(view: Callable[..., JsonResponse]) -> Callable[..., JsonResponse]:
    """401 unless logged in; resolve ``slug`` to a tenant the user may see, else 404."""

    @wraps(view)
    def wrapper(request: HttpRequest, slug: str, **kwargs: object) -> JsonResponse:
        if not request.user.is_authenticated:
            return _error(401, "log in first")
        try:
            tenant = tenant_for_user(user=request.user, slug=slug)
        except Tenant.DoesNotExist:
            return _error(404, "no such tenant")
        return view(request, tenant, **kwargs)

    return wrapper


def _key_json(api_key: ApiKey) -> dict[str, object]:
    budget = getattr(api_key, "budget", None)
    return {
        "id": api_key.pk,
        "name": api_key.name,
        "prefix": api_key.display,
        "created_at": api_key.created_at.isoformat(),
        "last_used_at": api_key.last_used_at.isoformat() if api_key.last_used_at else None,
        "revoked_at": api_key.revoked_at.isoformat() if api_key.revoked_at else None,
        "budget": {"limit": money_str(budget.limit), "period": budget.period} if budget else None,
    }


@require_GET
@tenant_api
def invoices(request: HttpRequest, tenant: Tenant) -> JsonResponse:
    data = [invoice_json(i, with_lines=False) for i in invoices_for_tenant(tenant=tenant)]
    return JsonResponse({"tenant": tenant.slug, "invoices": data})


@require_GET
@tenant_api
def invoice(request: HttpRequest, tenant: Tenant, invoice_id: int) -> JsonResponse:
    try:
        found = invoice_for_tenant(tenant=tenant, invoice_id=invoice_id)
    except Invoice.DoesNotExist:
        return _error(404, "no such invoice")
    return JsonResponse(invoice_json(found))


@require_http_methods(["GET", "POST"])
@tenant_api
def api_keys(request: HttpRequest, tenant: Tenant) -> JsonResponse:
    """GET: the tenant's keys (never their secrets). POST: create one; the answer carries its
    secret, the only time it is shown."""
    if request.method == "GET":
        keys = [_key_json(k) for k in api_keys_for_tenant(tenant=tenant)]
        return JsonResponse({"tenant": tenant.slug, "keys": keys})
    if not can_manage_keys(user=request.user, tenant=tenant):
        return _error(403, "only the tenant's admins manage its API keys")
    is_json = request.content_type == "application/json"
    data = _json_form(request.body) if is_json else request.POST
    if isinstance(data, JsonResponse):
        return data
    form = ApiKeyCreateForm(data)
    if not form.is_valid():
        return JsonResponse({"error": "invalid key", "fields": form.errors}, status=400)
    api_key, secret = api_key_create(tenant=tenant, created_by=request.user, **form.cleaned_data)
    response = JsonResponse({**_key_json(api_key), "secret": secret}, status=201)
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@tenant_api
def api_key_revoke_view(request: HttpRequest, tenant: Tenant, key_id: int) -> JsonResponse:
    try:
        api_key = api_key_for_tenant(tenant=tenant, key_id=key_id)
    except ApiKey.DoesNotExist:
        return _error(404, "no such key")
    if not can_manage_keys(user=request.user, tenant=tenant):
        return _error(403, "only the tenant's admins manage its API keys")
    api_key_revoke(api_key=api_key)
    return JsonResponse(_key_json(api_key))


@require_GET
@tenant_api
def budget(request: HttpRequest, tenant: Tenant) -> JsonResponse:
    """Every budget of the tenant: limit, spent, held, remaining, and when it resets."""
    statuses = [s.as_json() for s in budget_statuses_for_tenant(tenant=tenant)]
    return JsonResponse({"tenant": tenant.slug, "budgets": statuses})


@require_GET
@tenant_api
def usage(request: HttpRequest, tenant: Tenant) -> JsonResponse:
    """Dashboard data: spend per hour, charges by market and the top priority charges over the
    last ``hours`` hours (default 24)."""
    try:
        hours = whole_number(request.GET.get("hours", "24"), low=1, high=MAX_USAGE_HOURS)
    except ValueError as exc:
        return _error(400, f"hours {exc}")
    now = timezone.now()
    since = now - timedelta(hours=hours)
    return JsonResponse(
        {
            "tenant": tenant.slug,
            "spend_per_hour": [
                {"hour": h.hour.isoformat(), "amount": money_str(h.amount)}
                for h in spend_per_hour(tenant=tenant, hours=hours, now=now)
            ],
            "by_market": [
                {
                    "market": m.market,
                    "requests": m.requests,
                    "priority": money_str(m.priority),
                    "tokens": money_str(m.tokens),
                    "total": money_str(m.total),
                }
                for m in charges_by_market(tenant=tenant, since=since, until=now)
            ],
            "top_requests": [
                {
                    "request_id": t.request_id,
                    "market": t.market,
                    "round_id": t.round_id,
                    "amount": money_str(t.amount),
                    "created_at": t.created_at.isoformat(),
                }
                for t in top_requests_by_priority(tenant=tenant, since=since)
            ],
        }
    )
