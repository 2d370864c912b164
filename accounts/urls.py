"""Tenant pages and the tenant JSON API, mounted at the site root by ``config/urls.py``."""

from django.urls import path

from accounts import api, views

app_name = "accounts"

urlpatterns = [
    path("tenants/<slug:slug>/", views.tenant_home, name="tenant_home"),
    path("tenants/<slug:slug>/keys/", views.api_key_list, name="api_keys"),
    path(
        "tenants/<slug:slug>/keys/<int:key_id>/revoke/",
        views.api_key_revoke_view,
        name="api_key_revoke",
    ),
    path("tenants/<slug:slug>/invoices/", views.invoice_list, name="invoices"),
    path("tenants/<slug:slug>/invoices/<int:invoice_id>/", views.invoice_detail, name="invoice"),
    path(
        "tenants/<slug:slug>/invoices/<int:invoice_id>/csv/",
        views.invoice_csv_download,
        name="invoice_csv",
    ),
    path(
        "tenants/<slug:slug>/invoices/<int:invoice_id>/pdf/",
        views.invoice_pdf_download,
        name="invoice_pdf",
    ),
    path("api/tenants/<slug:slug>/budget/", api.budget, name="api_budget"),
    path("api/tenants/<slug:slug>/usage/", api.usage, name="api_usage"),
    path("api/tenants/<slug:slug>/keys/", api.api_keys, name="api_keys_json"),
    path(
        "api/tenants/<slug:slug>/keys/<int:key_id>/revoke/",
        api.api_key_revoke_view,
        name="api_key_revoke_json",
    ),
    path("api/tenants/<slug:slug>/invoices/", api.invoices, name="api_invoices"),
    path("api/tenants/<slug:slug>/invoices/<int:invoice_id>/", api.invoice, name="api_invoice"),
]
