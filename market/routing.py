"""Websocket routes of the market app (mounted by ``config/asgi.py``)."""

from django.urls import re_path

from market.consumers import OrderBookConsumer

# Slugs are what Django's SlugField accepts; the group name built from one stays valid.
websocket_urlpatterns = [
    re_path(r"^ws/markets/(?P<slug>[-a-zA-Z0-9_]{1,50})/book/$", OrderBookConsumer.as_asgi()),
]
