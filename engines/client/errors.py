"""The engine client's errors: what an engine's failure to serve a request becomes."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

DEFAULT_RETRY_AFTER_S = 1.0


class EngineError(Exception):
    """An engine did not serve a request. ``status`` is the engine's HTTP status, if it sent one."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class EngineUnavailable(EngineError):
    """The engine could not be reached or failed: refused, reset, timed out, a 5xx, garbage."""


class EngineTimedOut(EngineUnavailable):
    """The engine took the request but went silent: mid-answer for ``read_s``, or failing its
    health check while the answer had not begun, or not beginning within ``answer_s``."""


class EngineOverloaded(EngineError):
    """The engine's waiting queue is full (429); try again after ``retry_after_s`` seconds."""

    def __init__(self, message: str, *, retry_after_s: float, status: int | None = 429) -> None:
        super().__init__(message, status=status)
        self.retry_after_s = retry_after_s


class EngineRejected(EngineError):
    """The engine refused the request as malformed or impossible (400); ``param`` names the
    field when the engine says which."""

    def __init__(self, message: str, *, param: str | None = None, status: int | None = 400) -> None:
        super().__init__(message, status=status)
        self.param = param


def _transport_error(exc: BaseException, url: str) -> EngineUnavailable:
    kind = type(exc).__name__
    return EngineUnavailable(f"the engine at {url} is unavailable ({kind}: {exc or 'no detail'})")


def _error_fields(content: bytes) -> tuple[str, str | None]:
    """The message and param of an engine's JSON error body, or its text."""
    try:
        error = json.loads(content).get("error")
        if isinstance(error, dict):
            param = error.get("param")
            return str(error.get("message")), param if isinstance(param, str) else None
        if isinstance(error, str):
            return error, None
    except (ValueError, AttributeError):
        pass
    return content.decode("utf-8", "replace")[:500] or "no detail", None


def _status_error(status: int, content: bytes, headers: Mapping[str, str]) -> EngineError:
    message, param = _error_fields(content)
    if status == 429:
        return EngineOverloaded(message, retry_after_s=_retry_after(headers.get("retry-after")))
    if status in (400, 413, 422):
        return EngineRejected(message, param=param, status=status)
    return EngineUnavailable(f"the engine answered {status}: {message}", status=status)


def _stream_error(error: Any) -> EngineError:
    code = error.get("code") if isinstance(error, dict) else None
    message = str(error.get("message") if isinstance(error, dict) else error)
    if code == 429:
        return EngineOverloaded(message, retry_after_s=DEFAULT_RETRY_AFTER_S)
    if code == 400:
        return EngineRejected(message)
    status = code if isinstance(code, int) and not isinstance(code, bool) else None
    return EngineUnavailable(f"the engine failed mid-stream: {message}", status=status)


def _retry_after(value: str | None) -> float:
    """Seconds from a Retry-After header (delta-seconds form); the default when absent."""
    try:
        seconds = float(value) if value is not None else DEFAULT_RETRY_AFTER_S
    except ValueError:
        return DEFAULT_RETRY_AFTER_S
    return seconds if math.isfinite(seconds) and seconds >= 0 else DEFAULT_RETRY_AFTER_S
