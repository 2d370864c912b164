"""The gateway's errors (docs/api.md, "Errors"), each an HTTP status with an OpenAI-style JSON
body.

``{"error": {"message", "type", "param", "code"}}``: ``type`` is OpenAI's category
(``invalid_request_error``, ``authentication_error``, ...), ``code`` a short machine-readable
reason (``insufficient_quota``, ``model_not_found``, ...), ``param`` the offending field or null.
Bad input is always a 4xx; a 5xx only ever means the engine (or the gateway's own setup) failed.
"""

from __future__ import annotations

from typing import Any, Self

from django.http import JsonResponse


class GatewayError(Exception):
    """An answer other than 200: ``status``, the error body's fields, extra response headers."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    @classmethod
    def retrying(cls, what: str, seconds: int, detail: str = "") -> Self:
        """This error, to be tried again after ``seconds`` (whole seconds): said in its message
        and in its ``Retry-After`` header."""
        return cls(
            f"{what}; retry after {seconds} s{detail}", headers={"Retry-After": str(seconds)}
        )

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class MalformedRequest(GatewayError):
    """400: the body is not JSON, a field has the wrong type, a required field is missing."""

    status = 400
    code = "malformed_request"


class BodyTooLarge(MalformedRequest):
    """413: the body is larger than the server takes (DATA_UPLOAD_MAX_MEMORY_SIZE)."""

    status = 413
    code = "request_too_large"


class InvalidValue(GatewayError):
    """422: well-formed but unacceptable (a bad bid, max_tokens out of range, no messages)."""

    status = 422
    code = "invalid_value"


class InvalidApiKey(GatewayError):
    """401: no key, an unknown key, or a revoked key."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class BudgetExhaustedError(GatewayError):
    """429 ``insufficient_quota``, OpenAI's answer to an exhausted quota: the request's worst
    case does not fit a budget. The message says what happened (this request's hold is more
    than the budget has left, or spent and held have used it up), with which budget, its spent,
    held and left, what the request needed and when it resets, and what to do; ``budget``, the
    same figures for a program, is sent as ``error.budget`` (``BudgetExhausted.figures``:
    ``reason``, ``budget_id``, ``scope``, ``period``, ``limit``, ``spent``, ``held``,
    ``remaining``, ``needed``, ``resets_at``, ``seconds_until_reset``). The official clients
    raise ``RateLimitError`` with ``code == "insufficient_quota"``.

    Not a transient, so told apart from ``queue_full`` (also 429) by its code (the batch runner
    waits out only ``EngineBusy``), and sent with ``x-should-retry: false``, the header OpenAI's
    own clients obey (without it they retry every 429), and no ``Retry-After``: OpenAI sends
    none for this error, whose remedy is more budget, not a retry; the reset may be days away or
    never (period "none"), and a retry helper that honours ``Retry-After`` would park its worker
    that long, while held money may come back much sooner, as requests in flight finish. The
    reset time is in the message for a person and in ``GET /v1/budgets`` for a program."""

    status = 429
    type = "insufficient_quota"
    code = "insufficient_quota"

    def __init__(
        self, message: str, *, budget: dict[str, object] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(message, **kwargs)
        self.budget = budget
        self.headers.setdefault("x-should-retry", "false")

    def body(self) -> dict[str, Any]:
        body = super().body()
        if self.budget is not None:
            body["error"]["budget"] = self.budget
        return body


class Forbidden(GatewayError):
    """403: the credentials are right but do not allow this."""

    status = 403
    type = "permission_error"
    code = "forbidden"


class NotFound(GatewayError):
    """404: no such endpoint (or object)."""

    status = 404
    code = "not_found"


class ModelNotFound(GatewayError):
    """404: no active market serves this model."""

    status = 404
    code = "model_not_found"


class MethodNotAllowed(GatewayError):
    """405: the endpoint does not take this method."""

    status = 405
    code = "method_not_allowed"


class EngineBusy(GatewayError):
    """429: the engine's waiting queue is full; ``Retry-After`` says when to try again."""

    status = 429
    type = "rate_limit_error"
    code = "queue_full"


class ServerError(GatewayError):
    """500: the gateway itself failed (a bug, a batch run that broke); ``code`` says where."""

    status = 500
    type = "server_error"
    code = "internal_error"


class EngineDown(GatewayError):
    """503: the engine is down or failed; the request was not served and is not charged."""

    status = 503
    type = "service_unavailable"
    code = "engine_unavailable"


class EngineBidLost(GatewayError):
    """502: the engine did not read the bid the gateway sent (it reported another, or none):
    something between them (a router, an engine without the market's plugin) lost it. The
    request is failed and not charged rather than served at the wrong priority."""

    status = 502
    type = "server_error"
    code = "engine_bid_lost"


class EngineTimeout(EngineDown):
    """504: the engine took the request but went silent past its timeouts (ENGINE_*_TIMEOUT_S);
    the request was not served and is not charged."""

    status = 504
    code = "engine_timeout"


def error_response(exc: GatewayError) -> JsonResponse:
    """``exc`` as its JSON answer, with its headers."""
    response = JsonResponse(exc.body(), status=exc.status)
    for name, value in exc.headers.items():
        response[name] = value
    # Counted in the metrics; Django's "Bad Request: ..." warning per refusal would be noise.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


class DatabaseBusy(GatewayError):
    """503: the database stayed locked past its timeout (a PostgreSQL lock timeout, deadlock
    or serialization failure); ``Retry-After`` says when to try again.
    Raised by the gateway's database steps (``db.db_call``), whose transactions roll back."""

    status = 503
    type = "server_busy"
    code = "database_busy"


class DatabaseUnavailable(GatewayError):
    """503: the database could not be reached (stopped, restarting, its connection cut);
    ``Retry-After`` says when to try again. Raised by the gateway's database steps
    (``db.db_call``): nothing was held or charged by the step that failed, or, where that is
    unknown, the hold is released once the database answers again."""

    status = 503
    type = "server_error"
    code = "database_unavailable"
