"""The gateway's own ASGI handler: Django without the site's middleware, for ``/v1/`` and
``/metrics``.

Under ASGI each of the site's synchronous middleware (sessions, CSRF, auth, messages, ...) costs
two hops to a worker thread per request, about 2.5 ms in all on a small machine: more than the
gateway's own work. The API needs none of them (no cookies, no sessions, no pages; it
authenticates by API key), so its paths go to a handler whose middleware chain is empty. URL
resolution, views and error handling are Django's as usual.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response

ASGIApp = Callable[
    [dict, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]
]
GATEWAY_PREFIXES = ("/v1/", "/metrics")


class GatewayASGIHandler(ASGIHandler):
    """Django's ASGI handler with no middleware."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        get_response = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(get_response)


def with_gateway(site: ASGIApp) -> ASGIApp:
    """An HTTP app that sends the gateway's paths to :class:`GatewayASGIHandler` and every
    other path to ``site``."""
    gateway = GatewayASGIHandler()

    async def app(scope: dict, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(GATEWAY_PREFIXES):
            await gateway(scope, receive, send)
        else:
            await site(scope, receive, send)

    return app
