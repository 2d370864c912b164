"""The one client for an engine's native HTTP API (SGLang's ``POST /generate``).

The same code talks to the simulated engine (``scheduler_bridge.sim``) and to SGLang with our
plugin: a request is ``rid``, ``text`` or ``input_ids``, ``sampling_params.max_new_tokens`` and
``sampling_params.custom_params.bid`` (dollars per second of waiting). The answer's ``meta_info``
has SGLang's fields (``prompt_tokens``, ``cached_tokens``, ``completion_tokens``,
``finish_reason``, ...) and, from the simulated engine only, the auction's (``charge`` in
dollars, ``round_id``, ``position``): every auction field is optional here, because SGLang does
not send them.

Connections are pooled: one ``aiohttp.ClientSession`` per event loop, reused by every request of
that loop (a session must not cross loops). aiohttp rather than httpx: on the gateway's hot path
it costs about a quarter of httpx's CPU per request. Failures become three typed errors:
:class:`EngineUnavailable` (refused, reset, timed out, 5xx, garbage), :class:`EngineOverloaded`
(429, with ``retry_after_s``) and :class:`EngineRejected` (400, with the engine's message).
"""

from __future__ import annotations

import asyncio
import json
import math
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

CONNECT_TIMEOUT_S = 2.0
# A request may wait in the engine's queue, then generate, for a long time: reads may be slow.
READ_TIMEOUT_S = 600.0
MAX_CONNECTIONS = 512
DEFAULT_RETRY_AFTER_S = 1.0


class EngineError(Exception):
    """An engine did not serve a request. ``status`` is the engine's HTTP status, if it sent one."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class EngineUnavailable(EngineError):
    """The engine could not be reached or failed: refused, reset, timed out, a 5xx, garbage."""


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


@dataclass(frozen=True)
class EngineMeta:
    """What an engine reported about a request. Counts in tokens, times in engine seconds,
    ``charge`` in dollars. The auction fields are None when the engine does not send them."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str | None  # "length", "stop", "abort", ... (None while running)
    charge: float | None = None
    round_id: str | None = None
    position: int | None = None
    ttft_s: float | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class EngineOutput:
    """A finished, non-streamed generation."""

    text: str
    meta: EngineMeta


@dataclass(frozen=True)
class EngineChunk:
    """One streamed event: ``delta`` is the new text since the previous chunk."""

    delta: str
    meta: EngineMeta


def generate_body(
    *,
    rid: str,
    max_new_tokens: int,
    bid: float,
    text: str | None = None,
    input_ids: list[int] | None = None,
    sampling_params: Mapping[str, Any] | None = None,
    stream: bool = False,
) -> dict[str, Any]:
    """The JSON body of ``POST /generate``; ``bid`` in dollars per second of waiting."""
    if (text is None) == (input_ids is None):
        raise ValueError("give exactly one of text and input_ids")
    sampling = dict(sampling_params or {})
    sampling["max_new_tokens"] = max_new_tokens
    sampling["custom_params"] = {"bid": bid}
    body: dict[str, Any] = {"rid": rid, "sampling_params": sampling, "stream": stream}
    if text is not None:
        body["text"] = text
    else:
        body["input_ids"] = input_ids
    return body


_JSON = {"Content-Type": "application/json"}
# Errors of the transport: refused, reset, a broken answer, a timeout.
_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError)


class EngineClient:
    """Talks to engines at any base URL; holds one pooled ``aiohttp.ClientSession`` per event
    loop."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        # No overall limit: a request may wait long in the engine's queue; reads may pause for
        # up to read_timeout_s, connecting may take connect_timeout_s.
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._max_connections = max_connections
        self._sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession]
        self._sessions = weakref.WeakKeyDictionary()

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                timeout=self._timeout,
            )
            self._sessions[loop] = session
        return session

    async def aclose(self) -> None:
        """Close the running loop's connections (the next call opens new ones)."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()

    async def generate(self, *, base_url: str, body: Mapping[str, Any]) -> EngineOutput:
        """``POST /generate`` without streaming; EngineError subclasses on failure."""
        url = base_url.rstrip("/") + "/generate"
        payload = json.dumps({**body, "stream": False}).encode()
        try:
            async with self._client().post(url, data=payload, headers=_JSON) as response:
                status, headers, content = response.status, response.headers, await response.read()
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(exc, url) from exc
        if status != 200:
            raise _status_error(status, content, headers)
        try:
            data = json.loads(content)
            return EngineOutput(text=str(data.get("text") or ""), meta=meta_parsed(data))
        except (ValueError, TypeError, AttributeError) as exc:
            raise EngineUnavailable(f"the engine answered malformed JSON: {exc}") from exc

    async def generate_stream(
        self, *, base_url: str, body: Mapping[str, Any]
    ) -> AsyncIterator[EngineChunk]:
        """``POST /generate`` streamed: one :class:`EngineChunk` per server-sent event.

        The engine's errors before the first event raise at the first ``__anext__``. Closing the
        iterator early (the client went away) closes the connection, which tells the engine to
        cancel or abandon the request.
        """
        url = base_url.rstrip("/") + "/generate"
        payload = json.dumps({**body, "stream": True}).encode()
        try:
            response = await self._client().post(url, data=payload, headers=_JSON)
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(exc, url) from exc
        try:
            if response.status != 200:
                raise _status_error(response.status, await response.read(), response.headers)
            text = ""
            async for line in _lines(response):
                if not line.startswith("data:"):
                    continue
                payload_text = line[5:].strip()
                if payload_text == "[DONE]":
                    return
                try:
                    event = json.loads(payload_text)
                except ValueError as exc:
                    raise EngineUnavailable(f"the engine streamed malformed JSON: {exc}") from exc
                if not isinstance(event, dict):
                    raise EngineUnavailable("the engine streamed an event that is not an object")
                if "error" in event:
                    raise _stream_error(event["error"])
                chunk_text = str(event.get("text") or "")
                # SGLang streams the whole text so far (unless incremental output is on):
                # a continuation of what came before is cumulative, anything else a delta.
                if chunk_text.startswith(text):
                    delta, text = chunk_text[len(text) :], chunk_text
                else:
                    delta, text = chunk_text, text + chunk_text
                yield EngineChunk(delta=delta, meta=meta_parsed(event))
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(exc, url) from exc
        finally:
            # Read to the end, the connection goes back to the pool; else closing it tells the
            # engine that no one is listening any more.
            if response.content.at_eof():
                response.release()
            else:
                response.close()


async def _lines(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The lines of a streamed answer, without their line ends, however long they are."""
    pending = b""
    async for chunk in response.content.iter_any():
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8", "replace")


def meta_parsed(data: Mapping[str, Any]) -> EngineMeta:
    """The ``meta_info`` of an engine's answer; the auction fields may be missing."""
    info = data.get("meta_info")
    if not isinstance(info, dict):
        raise TypeError("the answer has no meta_info object")
    finish = info.get("finish_reason")
    if isinstance(finish, dict):
        finish = finish.get("type")
    return EngineMeta(
        prompt_tokens=_count(info.get("prompt_tokens")),
        cached_tokens=_count(info.get("cached_tokens")),
        completion_tokens=_count(info.get("completion_tokens")),
        finish_reason=finish if isinstance(finish, str) else None,
        charge=_finite(info.get("charge")),
        round_id=info["round_id"] if isinstance(info.get("round_id"), str) else None,
        position=info["position"] if _is_int(info.get("position")) else None,
        ttft_s=_finite(info.get("ttft")),
        raw=info,
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> int:
    return value if _is_int(value) and value >= 0 else 0


def _finite(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


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
    return EngineUnavailable(f"the engine failed mid-stream: {message}", status=_int_or_none(code))


def _int_or_none(value: Any) -> int | None:
    return value if _is_int(value) else None


def _retry_after(value: str | None) -> float:
    """Seconds from a Retry-After header (delta-seconds form); the default when absent."""
    try:
        seconds = float(value) if value is not None else DEFAULT_RETRY_AFTER_S
    except ValueError:
        return DEFAULT_RETRY_AFTER_S
    return seconds if math.isfinite(seconds) and seconds >= 0 else DEFAULT_RETRY_AFTER_S


_default = EngineClient()


def engine_client() -> EngineClient:
    """The process-wide engine client (its connection pools are per event loop)."""
    return _default
