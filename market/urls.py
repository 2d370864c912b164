"""The operator console's pages, mounted at ``/console/`` by ``config/urls.py``."""

from django.urls import path

from market import views

app_name = "market"

urlpatterns = [
    path("", views.console_index, name="console_index"),
    path("markets/<slug:slug>/", views.console, name="console"),
    path("markets/<slug:slug>/reserve/", views.reserve_set, name="reserve_set"),
    path("markets/<slug:slug>/reserve/impact/", views.reserve_impact, name="reserve_impact"),
    path("markets/<slug:slug>/reserve/whatif/", views.reserve_whatif, name="reserve_whatif"),
    path("markets/<slug:slug>/reserve-max/", views.reserve_max_set, name="reserve_max_set"),
    path("markets/<slug:slug>/policy/", views.policy_set, name="policy_set"),
    path("markets/<slug:slug>/wait-bound/", views.wait_bound_set, name="wait_bound_set"),
    path("markets/<slug:slug>/auto-reserve/", views.auto_reserve_set, name="auto_reserve_set"),
    path("markets/<slug:slug>/alerts/", views.alerts_set, name="alerts_set"),
]
