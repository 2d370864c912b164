"""The tenant's pages about its API use, mounted at the site root by ``config/urls.py``: the
dashboard (live spend and latency, recent requests, batches) and batch uploads and downloads."""

from django.urls import path

from openai_api import dashboard_views
from openai_api.batches import console_views

app_name = "dashboard"

urlpatterns = [
    path(
        "tenants/<slug:slug>/dashboard/",
        dashboard_views.tenant_dashboard,
        name="tenant_dashboard",
    ),
    path(
        "tenants/<slug:slug>/dashboard/quotes/",
        dashboard_views.tenant_quotes,
        name="tenant_quotes",
    ),
    path("tenants/<slug:slug>/batches/", console_views.batch_upload, name="batch_upload"),
    path(
        "tenants/<slug:slug>/batches/<str:public_id>/output/",
        console_views.batch_output,
        name="batch_output",
    ),
    path(
        "tenants/<slug:slug>/batches/<str:public_id>/errors/",
        console_views.batch_errors,
        name="batch_errors",
    ),
]
