"""The OpenAI-compatible HTTP endpoints (thin: the flow is in ``services``).

``POST /v1/chat/completions``, ``POST /v1/completions`` (both streamed or not), ``GET /v1/models``,
``GET /v1/budgets``, ``GET /v1/quotes``, ``GET /v1/organization/usage/completions``,
``GET /v1/organization/costs``, authenticated by ``Authorization: Bearer <API key>``;
``GET /metrics`` for Prometheus, with ``Authorization: Bearer <METRICS_TOKEN>`` (off while that
setting is unset). Every error is an OpenAI-style JSON body (``errors``).
"""

from __future__ import annotations

import functools
import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from accounts.selectors.usage import (
    COST_GROUPS,
    USAGE_GROUPS,
    completions_usage_for_tenant,
    costs_for_tenant,
)
from openai_api.gateway import metrics, services
from openai_api.gateway.asgi import refusal_for
from openai_api.gateway.db import db_call
from openai_api.gateway.errors import (
    Forbidden,
    GatewayError,
    InvalidApiKey,
    MethodNotAllowed,
    error_response,
)
from openai_api.gateway.keys import api_key_authenticated
from openai_api.gateway.queries import CostsParams, QuoteQuery, UsageParams, usage_params
from openai_api.gateway.refusals import body_parsed, validated
from openai_api.gateway.selectors import budgets_for_key
from openai_api.gateway.validation import CHAT, COMPLETIONS, completion_params

_View = Callable[..., Awaitable[HttpResponse]]


def _methods(request: HttpRequest, *allowed: str) -> None:
    """MethodNotAllowed unless the request's method is one of ``allowed``."""
    if request.method not in allowed:
        raise MethodNotAllowed(f"{request.method} is not allowed here; use {' or '.join(allowed)}")


def refusals_answered(*allowed: str, counted_as: str | None = None) -> Callable[[_View], _View]:
    """An async view taking the methods ``allowed`` only, each GatewayError it raises answered
    as its JSON error, and exempt from CSRF (no cookies here). With ``counted_as``, each answer
    is counted in the metrics as that endpoint's (no market)."""

    def decorate(view: _View) -> _View:
        @csrf_exempt
        @functools.wraps(view)
        async def answered(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            error = None
            try:
                _methods(request, *allowed)
                response = await view(request, *args, **kwargs)
            except GatewayError as exc:
                response, error = error_response(exc), exc.code
            if counted_as is not None:
                metrics.answered(market=metrics.NO_MARKET, endpoint=counted_as,
                                 status=response.status_code, error=error)  # fmt: skip
            return response

        return answered

    return decorate


def _bearer(request: HttpRequest) -> str | None:
    """The API key of ``Authorization: Bearer <key>``, or None."""
    scheme, _, key = request.headers.get("Authorization", "").strip().partition(" ")
    return key.strip() or None if scheme.lower() == "bearer" else None


def _gateway_headers(request: HttpRequest) -> dict[str, str]:
    """The headers ``validation.completion_params`` reads, by lower-case name (read from META:
    ``request.headers`` would build a map of every header, per request)."""
    meta = request.META
    return {
        n: meta[m]
        for n, m in (("x-bid", "HTTP_X_BID"), ("x-request-class", "HTTP_X_REQUEST_CLASS"))
        if m in meta
    }


async def _completion(request: HttpRequest, endpoint: str) -> HttpResponse:
    trace = services.Trace(endpoint=endpoint)
    started = time.perf_counter()
    try:
        _methods(request, "POST")
        params = completion_params(
            body_parsed(request.body), endpoint=endpoint, headers=_gateway_headers(request)
        )
        if params.stream:
            events = await services.completion_stream(
                params=params, key=_bearer(request), trace=trace
            )
            response: HttpResponse = StreamingHttpResponse(events, content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"  # proxies must not buffer the stream
        else:
            body = await services.completion_create(
                params=params, key=_bearer(request), trace=trace
            )
            response = JsonResponse(body)
    except Exception as exc:  # noqa: BLE001 (every exception becomes an answer, counted)
        error = refusal_for(exc, request)
        metrics.answered(market=trace.market, endpoint=endpoint, status=error.status,
                         error=error.code)  # fmt: skip
        return error_response(error)
    metrics.answered(market=trace.market, endpoint=endpoint, status=200)
    metrics.DURATION.labels(trace.market, endpoint).observe(time.perf_counter() - started)
    return response


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    """``POST /v1/chat/completions``."""
    return await _completion(request, CHAT)


@csrf_exempt
async def completions(request: HttpRequest) -> HttpResponse:
    """``POST /v1/completions``."""
    return await _completion(request, COMPLETIONS)


@refusals_answered("GET", counted_as="models")
async def models(request: HttpRequest) -> HttpResponse:
    """``GET /v1/models``: the active markets' served models."""
    return JsonResponse(await services.models_list(key=_bearer(request)))


@refusals_answered("GET", counted_as="budgets")
async def budgets(request: HttpRequest) -> HttpResponse:
    """``GET /v1/budgets``: the budgets this key's requests must fit, spent, held and left, and
    its tenant's month (``selectors.budgets_for_key``)."""
    api_key = await db_call(api_key_authenticated, key=_bearer(request))
    return JsonResponse(await db_call(budgets_for_key, api_key=api_key))


@refusals_answered("GET", counted_as="quotes")
async def quotes(request: HttpRequest) -> HttpResponse:
    """``GET /v1/quotes?model=M&ttft_s=T[&probability=P][&bid=B]``: the bid that buys a first
    token within T seconds with probability P (0.9 unless given) now, and the waits bid B buys
    (``services.quote_read``)."""
    key = _bearer(request)
    return JsonResponse(
        await services.quote_read(key=key, params=validated(QuoteQuery, request.GET.dict()))
    )


async def _usage_read(
    request: HttpRequest,
    groups: dict[str, str],
    select: Callable[..., dict],
    model: type[UsageParams] = UsageParams,
) -> HttpResponse:
    """A usage read of the key's tenant: authenticated, then ``select(tenant_id=, query=)``
    over the page that the query asks for (``queries.usage_params``)."""
    api_key = await db_call(api_key_authenticated, key=_bearer(request))
    query = usage_params(request.GET, model=model, groups=groups, now=int(time.time()))
    return JsonResponse(await db_call(select, tenant_id=api_key.tenant_id, query=query))


@refusals_answered("GET", counted_as="usage_completions")
async def usage_completions(request: HttpRequest) -> HttpResponse:
    """``GET /v1/organization/usage/completions?start_time=S[&end_time=E][&bucket_width=W]
    [&group_by=G][&limit=N][&page=P]``: the tenant's tokens and requests per time bucket
    (``accounts.selectors.usage``)."""
    return await _usage_read(request, USAGE_GROUPS, completions_usage_for_tenant)


@refusals_answered("GET", counted_as="costs")
async def costs(request: HttpRequest) -> HttpResponse:
    """``GET /v1/organization/costs`` (the query of ``usage_completions``): the tenant's
    charges per time bucket, by line item ``tokens`` or ``priority`` when grouped so."""
    return await _usage_read(request, COST_GROUPS, costs_for_tenant, CostsParams)


def _metrics_allowed(request: HttpRequest) -> None:
    """Forbidden while ``METRICS_TOKEN`` is unset; InvalidApiKey unless the request carries
    ``Authorization: Bearer <METRICS_TOKEN>`` (compared in constant time)."""
    token = settings.METRICS_TOKEN
    if token is None:
        raise Forbidden("/metrics is off: set METRICS_TOKEN to scrape it", code="metrics_disabled")
    given = _bearer(request) or ""
    # Header values are latin-1 text of the bytes sent: back to those bytes, as the token's.
    if not hmac.compare_digest(given.encode("latin-1", "replace"), token.encode()):
        raise InvalidApiKey(
            "/metrics needs Authorization: Bearer <METRICS_TOKEN>",
            code="invalid_metrics_token",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def prometheus(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: the gateway's Prometheus exposition, for ``METRICS_TOKEN``'s bearer."""
    try:
        _methods(request, "GET")
        _metrics_allowed(request)
    except GatewayError as exc:
        return error_response(exc)
    return HttpResponse(metrics.exposition(), content_type=metrics.CONTENT_TYPE)
