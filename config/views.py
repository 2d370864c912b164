"""Project-level views: the home page and the health endpoint."""

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from accounts.selectors import tenants_for_user
from config.health import health_report


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """Landing page: what this is, who is signed in, where to go next."""
    return render(request, "home.html", {"tenants": tenants_for_user(user=request.user)})


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database and Redis (if configured) answer, 503 otherwise."""
    report = health_report()
    return JsonResponse(report, status=200 if report["status"] == "ok" else 503)
