"""URL routes. Websocket routes are in ``config/asgi.py``."""

from django.contrib import admin
from django.urls import include, path

from config import views

urlpatterns = [
    # The OpenAI-compatible gateway (/v1/...) and its /metrics, first: the hot path.
    path("", include("openai_api.urls")),
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("assets/plotly.min.js", views.plotly_js, name="plotly_js"),
    path("console/", include("market.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("", include("accounts.urls")),
    path("", include("openai_api.console_urls")),
]
