"""Routes of the tenant-facing API, mounted at the site root by ``config/urls.py``: the
OpenAI-compatible gateway and batch API (``/v1/...``), the gateway's ``/metrics``, and the API's
reference (``/v1/openapi.json``, rendered at ``/docs/api/``)."""

from django.urls import path

from openai_api.batches import views as batch_views
from openai_api.gateway import views
from openai_api.openapi import views as reference_views

app_name = "gateway"

urlpatterns = [
    path("v1/chat/completions", views.chat_completions, name="chat_completions"),
    path("v1/completions", views.completions, name="completions"),
    path("v1/models", views.models, name="models"),
    path("v1/budgets", views.budgets, name="budgets"),
    path("v1/quotes", views.quotes, name="quotes"),
    path("v1/organization/usage/completions", views.usage_completions, name="usage_completions"),
    path("v1/organization/costs", views.costs, name="costs"),
    path("v1/batches", batch_views.batches, name="batches"),
    path("v1/batches/<str:batch_id>", batch_views.batch, name="batch"),
    path("v1/batches/<str:batch_id>/cancel", batch_views.batch_cancel_view, name="batch_cancel"),
    path("v1/batches/<str:batch_id>/output", batch_views.batch_output, name="batch_output"),
    path("v1/batches/<str:batch_id>/errors", batch_views.batch_errors, name="batch_errors"),
    path("v1/openapi.json", reference_views.openapi_json, name="openapi"),
    path("metrics", views.prometheus, name="metrics"),
    path("docs/api/", reference_views.reference_page, name="api_reference"),
]
