"""``GET /v1/openapi.json`` (the document, no key needed) and ``GET /docs/api/`` (the document
rendered by Redoc, whose bundle is served as a static file of the drf-spectacular-sidecar
package: no CDN)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from openai_api.gateway.views import refusals_answered
from openai_api.openapi.document import openapi_document


@refusals_answered("GET")
async def openapi_json(request: HttpRequest) -> HttpResponse:
    """``GET /v1/openapi.json``."""
    return JsonResponse(openapi_document())


@require_GET
def reference_page(request: HttpRequest) -> HttpResponse:
    """``GET /docs/api/``: the reference, rendered in the browser from ``/v1/openapi.json``."""
    return render(request, "openai_api/api_reference.html")
