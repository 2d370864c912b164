"""The gateway's own ASGI handler: Django without the site's middleware, for ``/v1/`` and
``/metrics``.

Under ASGI each of the site's synchronous middleware (sessions, CSRF, auth, messages, ...) costs
two hops to a worker thread per request, about 2.5 ms in all on a small machine: more than the
gateway's own work. The API needs none of them (no cookies, no sessions, no pages; it
authenticates by API key), so its paths go to a handler whose middleware chain is empty. URL
resolution, views and error handling are Django's as usual.

Django would also run each request's signals (request_started, request_finished) on a worker
thread started for that request: the gateway runs them on the event loop instead (see
:meth:`GatewayASGIHandler.handle`), which saves a thread and two hops to it per request.

Every answer here is OpenAI-style JSON, errors included: an unknown path (404), a Host that
``ALLOWED_HOSTS`` does not allow (400: the check the site's CommonMiddleware makes, done here
since no middleware runs), a request Django cannot read, and any exception a view lets out
(500, logged), instead of Django's HTML pages (or its debug page with ``DEBUG`` on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.core import signals
from django.core.exceptions import (
    BadRequest,
    DisallowedHost,
    PermissionDenied,
    RequestAborted,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.dispatch import Signal
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import set_script_prefix

from openai_api.gateway.db import drained, request_tracked
from openai_api.gateway.errors import (
    BodyTooLarge,
    Forbidden,
    GatewayError,
    MalformedRequest,
    NotFound,
    ServerError,
    error_response,
)

logger = logging.getLogger(__name__)
# At the server's stop, how long the requests it cut off may take to release their holds,
# seconds (``lifespan``): with uvicorn's --timeout-graceful-shutdown (config.serving), within
# supervisord's stopwaitsecs (10 s), after which the process group is killed.
STOP_DRAIN_S = 3.0
ASGIApp = Callable[
    [dict, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]
]
GATEWAY_PREFIXES = ("/v1/", "/metrics")
_GetResponse = Callable[[HttpRequest], Awaitable[HttpResponse]]


def refusal_for(exc: Exception, request: HttpRequest | None = None) -> GatewayError:
    """The gateway's error for an exception Django or a view raised (a 500, logged, for any
    exception that is not one of Django's own refusals)."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, Http404):  # Resolver404 included: no such endpoint
        where = f" ({request.method} {request.path!r})" if request is not None else ""
        return NotFound(f"no such endpoint{where}", code="unknown_url")
    if isinstance(exc, DisallowedHost):
        return MalformedRequest(
            "the Host header names a host this server does not serve (ALLOWED_HOSTS)",
            param="Host",
            code="invalid_host",
        )
    if isinstance(exc, RequestDataTooBig):
        return BodyTooLarge("the request body is too large")
    if isinstance(exc, SuspiciousOperation | BadRequest):
        return MalformedRequest(f"bad request: {exc}")
    if isinstance(exc, PermissionDenied):
        return Forbidden("permission denied")
    logger.error("gateway: unexpected error on %s", request.path if request else "?", exc_info=exc)
    return ServerError("internal error in the gateway")


def json_errors(get_response: _GetResponse) -> _GetResponse:
    """``get_response`` behind the Host check, every exception answered as JSON."""

    async def inner(request: HttpRequest) -> HttpResponse:
        try:
            request.get_host()  # DisallowedHost unless ALLOWED_HOSTS allows it
            return await get_response(request)
        except Exception as exc:  # noqa: BLE001 (every exception becomes an answer)
            return error_response(refusal_for(exc, request))

    return inner


def _has_async_receivers(signal: Signal) -> bool:
    return any(entry[-1] is True for entry in signal.receivers)  # (key, receiver, is_async)


async def _sent(signal: Signal, **kwargs: Any) -> None:
    """Send ``signal`` on this thread, or Django's way when an async receiver is connected."""
    if _has_async_receivers(signal):
        await signal.asend(**kwargs)
    else:
        signal.send(**kwargs)


class GatewayASGIHandler(ASGIHandler):
    """Django's ASGI handler with no middleware, and no thread of its own per request."""

    async def __call__(self, scope: dict, receive, send) -> None:
        # Django runs each request in a ThreadSensitiveContext: a thread started for the request
        # and joined after it, where its synchronous code (views, middleware, the signals'
        # receivers) runs. The gateway has none: its views are async, their database work runs
        # on the gateway's own threads (``db``), and the signals are sent on the event loop.
        if scope["type"] != "http":
            raise ValueError(f"the gateway serves HTTP only, not {scope['type']}")
        await self.handle(scope, receive, send)

    async def handle(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        """Django 5.2's ``ASGIHandler.handle``, except that request_started and
        request_finished are sent on the event loop's thread, not on a worker thread.

        Their receivers (Django's: reset the query log, close the thread's stale database
        connections and caches, reset the URLconf) take microseconds and find nothing to close
        on the loop's thread, where no database connection is ever opened. If an async receiver
        is ever connected, the signals go the way Django sends them.
        """
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        await _sent(signals.request_started, sender=self.__class__, scope=scope)
        request, refused = self.create_request(scope, body_file)
        if request is None:  # Django could not read it: 400 or 413, as JSON
            body_file.close()
            error = BodyTooLarge if refused.status_code == 413 else MalformedRequest
            refused = error_response(error("the request cannot be read"))
            await self.send_response(refused, send)
            await self._closed(refused)
            return

        async def process_request(request, send):  # type: ignore[no-untyped-def]
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client disconnected during send_response
            return response

        # Listen for a disconnect while the response is made (as Django does).
        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            request_tracked(asyncio.create_task(process_request(request, send))),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # The server stops without waiting for this request any longer (uvicorn's
            # --timeout-graceful-shutdown): the view takes it as a client that left (its hold
            # released, or what a stream sent charged) before this handler ends.
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            body_file.close()
            if tasks[1].cancelled():
                raise
            await self._closed(tasks[1].result())  # answered anyway: an answer complete, charged
            return
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass  # the client went away
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()  # views may handle the cancellation
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            await _sent(signals.request_finished, sender=self.__class__)
        else:
            await self._closed(response)
        body_file.close()

    @staticmethod
    async def _closed(response: HttpResponse) -> None:
        """Close ``response`` (which sends request_finished) on this thread, unless an async
        receiver of request_finished needs Django's way."""
        if _has_async_receivers(signals.request_finished):
            await sync_to_async(response.close)()
        else:
            response.close()

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        # ASGI handlers load their middleware async (the gateway's views are async anyway).
        self._middleware_chain = json_errors(self._get_response_async)


async def lifespan(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
    """The ASGI lifespan protocol (uvicorn's ``--lifespan on``): nothing to do at startup; at
    shutdown, which uvicorn starts once the requests it waited for ended and it cancelled the
    others (``--timeout-graceful-shutdown``), wait up to :data:`STOP_DRAIN_S` seconds for those
    to unwind and for the releases and settlements they started (``db.drained``): a stopped
    gateway leaves no hold open. What is still running after that is the lost gateways' sweep's
    (``accounts.services.gateways``)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if not await drained(STOP_DRAIN_S):
                what = "gateway stop: requests or their releases still running after %g s"
                logger.warning(what, STOP_DRAIN_S)
            await send({"type": "lifespan.shutdown.complete"})
            return


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
