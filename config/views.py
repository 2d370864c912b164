"""Project-level views: the home page, the health endpoint, and plotly.js."""

from functools import cache
from pathlib import Path

import plotly
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.cache import patch_cache_control
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


PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


@cache
def _plotly_js_bytes() -> bytes:
    """The file, read once (a few MB): a plain response, no file iterator under ASGI."""
    return PLOTLY_JS.read_bytes()


@require_GET
def plotly_js(request: HttpRequest) -> HttpResponse:
    """plotly.js as bundled with the plotly Python package (no CDN, works offline).

    Public (it is a library); cached for a day, and revalidated by its ETag, the package's
    version, after an upgrade.
    """
    etag = f'"plotly-{plotly.__version__}"'
    if request.headers.get("If-None-Match") == etag:
        response = HttpResponse(status=304)
    else:
        response = HttpResponse(_plotly_js_bytes(), content_type="text/javascript")
    response["ETag"] = etag
    patch_cache_control(response, public=True, max_age=86400)
    return response
