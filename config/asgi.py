"""The ASGI application: HTTP through Django, websockets through Channels.

Served by uvicorn, granian or Daphne (``config.serving`` has their command lines; ``make run``
serves it with uvicorn when Redis is configured, Daphne otherwise), or ``manage.py runserver``.
"""

import gc
import os
from http import HTTPStatus

import django
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler
from twisted.web import http as twisted_http

# ASGI sends a status code only; Daphne (Twisted) takes the status line's reason phrase from
# twisted.web.http.RESPONSES, which lacks 422, 429 and others ("422 Unknown Status"): add the
# standard phrases of every code it lacks.
for _status in HTTPStatus:
    twisted_http.RESPONSES.setdefault(_status.value, _status.phrase.encode("ascii"))


class SiteASGIHandler(ASGIHandler):
    """Django's ASGI handler for the site's pages, except that the task listening for the
    client's disconnect ends without an exception when the client leaves.

    Django's ``handle`` runs that listener beside the request and reads its ``RequestAborted``
    (ignoring it) only while ``handle`` itself is running. When the server cancels ``handle``
    (uvicorn at its stop, past --timeout-graceful-shutdown; Daphne once a client left and
    ``application_close_timeout`` passed), the listener is left behind and raises
    ``RequestAborted`` when the connection closes, which nobody reads: asyncio logs "Task
    exception was never retrieved" with its traceback. Ending without one, it has nothing to
    log; ``handle`` treats a finished listener as the client gone, either way."""

    async def listen_for_disconnect(self, receive) -> None:  # type: ignore[no-untyped-def]
        try:
            await super().listen_for_disconnect(receive)
        except RequestAborted:
            return  # the client went away


os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Set up Django (the app registry) before importing anything that touches models (as Django's
# get_asgi_application does).
django.setup(set_prefix=False)
django_asgi_app = SiteASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from market.routing import websocket_urlpatterns as market_websockets  # noqa: E402
from openai_api.gateway.asgi import lifespan, with_gateway  # noqa: E402

http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.SERVE_STATIC else django_asgi_app
# The OpenAI-compatible API (/v1/..., /metrics) skips the site's middleware (sessions, CSRF, ...).
http_app = with_gateway(http_app)

application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter([*market_websockets]))
        ),
        # uvicorn's --lifespan on: at its stop, the gateway's cut-off requests release their holds.
        "lifespan": lifespan,
    }
)

# What is loaded by now (Django, the app registry, URL patterns, templates: ~120,000 objects) lives
# as long as the process. Python's full (generation 2) collection walks every tracked object:
# ~60 ms here on a small machine, a pause of every request in flight, taken every few minutes
# under load. Frozen, those objects are left out of every collection; what the requests
# allocate is still collected as usual.
gc.collect()
gc.freeze()
