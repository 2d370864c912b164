"""Websocket routes (mounted by ``config/asgi.py`` behind ``AuthMiddlewareStack``)."""

from django.urls import re_path

from market.consumers import MarketConsumer, TenantConsumer, UnknownPath

# Slugs are what Django's SlugField accepts; the group names built from them stay valid.
websocket_urlpatterns = [
    re_path(r"^ws/markets/(?P<slug>[-a-zA-Z0-9_]{1,50})/$", MarketConsumer.as_asgi()),
    re_path(r"^ws/tenants/(?P<slug>[-a-zA-Z0-9_]{1,50})/$", TenantConsumer.as_asgi()),
    re_path(r"", UnknownPath.as_asgi()),  # last: everything else is refused, cleanly
]
