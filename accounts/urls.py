"""Tenant pages and the tenant JSON API, mounted at the site root by ``config/urls.py``."""

from django.urls import include, path

from accounts import api, views

app_name = "accounts"

tenant_pages = [
    path("", views.tenant_home, name="tenant_home"),
    path("keys/", views.api_key_list, name="api_keys"),
    path("keys/<int:key_id>/revoke/", views.api_key_revoke_view, name="api_key_revoke"),
    path("invoices/", views.invoice_list, name="invoices"),
    path("invoices/<int:invoice_id>/", views.invoice_detail, name="invoice"),
    path("invoices/<int:invoice_id>/csv/", views.invoice_csv_download, name="invoice_csv"),
    path("invoices/<int:invoice_id>/pdf/", views.invoice_pdf_download, name="invoice_pdf"),
]
tenant_api = [
    path("budget/", api.budget, name="api_budget"),
    path("usage/", api.usage, name="api_usage"),
    path("keys/", api.api_keys, name="api_keys_json"),
    path("keys/<int:key_id>/revoke/", api.api_key_revoke_view, name="api_key_revoke_json"),
    path("invoices/", api.invoices, name="api_invoices"),
    path("invoices/<int:invoice_id>/", api.invoice, name="api_invoice"),
]

urlpatterns = [
    path("tenants/", views.tenant_list, name="tenants"),
    path("tenants/<slug:slug>/", include(tenant_pages)),
    path("api/tenants/<slug:slug>/", include(tenant_api)),
]
