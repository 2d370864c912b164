"""The one client for an engine's HTTP API: SGLang's ``POST /generate`` and health check, the
control path (a market's policy and reserve) and ``GET /metrics``.

The same code talks to the simulated engine (``engines.sim``) and to SGLang with our
plugin, directly or through SGLang's model gateway (smg): a request is ``rid`` (its id),
``text`` or ``input_ids``, ``sampling_params.max_new_tokens`` and the bid, dollars per second of
waiting, in ``sampling_params.custom_params`` (``wire.auction_params``). The answer's
``meta_info`` has SGLang's fields (``prompt_tokens``, ``cached_tokens``, ``completion_tokens``,
``finish_reason``, ...) and the auction's (the ``bid`` read, ``charge`` in dollars,
``round_id``, ``position``), which both engines send; each is optional here, so that an engine
without them is told apart by the caller (the gateway refuses an answer whose bid is not the
one sent).

Connections are pooled: one ``aiohttp.ClientSession`` per event loop, reused by every request of
that loop (a session must not cross loops). aiohttp rather than httpx: on the gateway's hot path
it costs about a quarter of httpx's CPU per request. Failures become typed errors:
:class:`EngineUnavailable` (refused, reset, 5xx, garbage), its subclass :class:`EngineTimedOut`
(the engine went silent), :class:`EngineOverloaded` (429, with ``retry_after_s``) and
:class:`EngineRejected` (400, with the engine's message).

Timeouts (:class:`EngineTimeouts`). Silence alone cannot tell a frozen engine from a busy one:
an engine sends nothing about a request while it waits in the queue (SGLang and the simulated
engine both), and a non-streamed answer is one block sent when the generation is over, so the
wait before an answer begins is legitimately long. Cutting it at a fixed silence would fail
every request of a long queue; waiting as long as any queue could last would leave a frozen
engine undetected for minutes. Streaming every request from the engine would not help (nothing
comes before the first token either) and would cost a quadratic amount of text, since SGLang
streams the whole text so far with each token. So the client asks the engine instead:

- ``connect_s``: connecting; past it the engine is unreachable (EngineUnavailable).
- ``read_s``: silence. Once an answer has begun (a stream's first bytes), the engine sends every
  decode step; ``read_s`` without a byte means it failed (EngineTimedOut). Before that, every
  ``read_s`` of silence the client checks the engine's ``GET /health_generate`` (SGLang's and
  the simulated engine's check that the scheduler still makes progress), one check at a time per
  engine shared by every request waiting on it, and gives up (EngineTimedOut) only when that
  check fails too (no answer within ``read_s``, or a 5xx): a frozen engine is found in about
  two ``read_s``, a busy one is waited for.
- ``answer_s``: the longest an answer may take to begin even while the engine looks healthy (a
  request it lost, a queue that never moves for this bid); for a non-streamed request that is
  the whole answer.
"""

from __future__ import annotations

import asyncio
import json
import math
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from engines.client.answers import (
    EngineChunk,
    EngineOutput,
    meta_parsed,
)
from engines.client.errors import (
    EngineRejected,
    EngineTimedOut,
    EngineUnavailable,
    _error_fields,
    _status_error,
    _stream_error,
    _transport_error,
)
from engines.contract.wire import CONTROL_PATH, control_body

# Defaults of EngineTimeouts, seconds (the gateway passes its settings, ENGINE_*_TIMEOUT_S).
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 30.0
ANSWER_TIMEOUT_S = 600.0
HEALTH_PATH = "/health_generate"
METRICS_PATH = "/metrics"
MAX_CONNECTIONS = 512


@dataclass(frozen=True)
class EngineTimeouts:
    """How long the client waits for an engine, seconds (see the module's docstring)."""

    connect_s: float = CONNECT_TIMEOUT_S  # connecting
    read_s: float = READ_TIMEOUT_S  # silence mid-answer; silence before a health check
    answer_s: float = ANSWER_TIMEOUT_S  # until the answer begins, even from a healthy engine

    def __post_init__(self) -> None:
        for name in ("connect_s", "read_s", "answer_s"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")


T = TypeVar("T")
_JSON = {"Content-Type": "application/json"}
# Errors of the transport: refused, reset, a broken answer, a timeout.
_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError)


class EngineClient:
    """Talks to engines at any base URL; holds one pooled ``aiohttp.ClientSession`` per event
    loop, and per loop and engine the latest health check (see the module's docstring)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.timeouts = EngineTimeouts(connect_timeout_s, read_timeout_s, answer_timeout_s)
        self._max_connections = max_connections
        self._sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession]
        self._sessions = weakref.WeakKeyDictionary()
        # loop -> engine base URL -> (loop time it started, the check: healthy or not)
        self._checks: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, tuple[float, asyncio.Task[bool]]]
        ] = weakref.WeakKeyDictionary()

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                timeout=_http_timeout(self.timeouts),
            )
            self._sessions[loop] = session
        return session

    async def aclose(self) -> None:
        """Close the running loop's connections (the next call opens new ones)."""
        loop = asyncio.get_running_loop()
        for _, check in self._checks.pop(loop, {}).values():
            check.cancel()
        session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()

    async def generate(
        self,
        *,
        base_url: str,
        body: Mapping[str, Any],
        timeouts: EngineTimeouts | None = None,
    ) -> EngineOutput:
        """``POST /generate`` without streaming; EngineError subclasses on failure.
        ``timeouts`` (this client's when None): the whole answer is one wait for it to begin."""
        t = timeouts or self.timeouts
        url = base_url.rstrip("/") + "/generate"
        payload = json.dumps({**body, "stream": False}).encode()
        began = asyncio.get_running_loop().time()
        try:
            status, headers, content = await self._watched(
                self._exchange(url, payload, t), base_url=base_url, t=t, began=began
            )
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(exc, url) from exc
        if status != 200:
            raise _status_error(status, content, headers)
        try:
            data = json.loads(content)
            return EngineOutput(text=str(data.get("text") or ""), meta=meta_parsed(data))
        except (ValueError, TypeError, AttributeError) as exc:
            raise EngineUnavailable(f"the engine answered malformed JSON: {exc}") from exc

    async def _exchange(
        self, url: str, payload: bytes, t: EngineTimeouts
    ) -> tuple[int, Mapping[str, str], bytes]:
        """The status, headers and body of a non-streamed ``POST``."""
        async with self._client().post(
            url, data=payload, headers=_JSON, timeout=_http_timeout(t)
        ) as response:
            return response.status, response.headers, await response.read()

    async def generate_stream(
        self,
        *,
        base_url: str,
        body: Mapping[str, Any],
        timeouts: EngineTimeouts | None = None,
    ) -> AsyncIterator[EngineChunk]:
        """``POST /generate`` streamed: one :class:`EngineChunk` per server-sent event.

        The engine's errors before the first event raise at the first ``__anext__``. Closing the
        iterator early (the client went away) closes the connection, which tells the engine to
        cancel or abandon the request. ``timeouts``: this client's when None.
        """
        t = timeouts or self.timeouts
        url = base_url.rstrip("/") + "/generate"
        payload = json.dumps({**body, "stream": True}).encode()
        began = asyncio.get_running_loop().time()
        try:
            response = await self._watched(
                self._client().post(url, data=payload, headers=_JSON, timeout=_http_timeout(t)),
                base_url=base_url,
                t=t,
                began=began,
            )
        except _TRANSPORT_ERRORS as exc:
            raise _transport_error(exc, url) from exc
        try:
            if response.status != 200:
                raise _status_error(response.status, await response.read(), response.headers)
            text = ""
            async for line in self._lines(response, base_url=base_url, t=t, began=began):
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

    async def _lines(
        self, response: aiohttp.ClientResponse, *, base_url: str, t: EngineTimeouts, began: float
    ) -> AsyncIterator[str]:
        """The lines of a streamed answer, without their line ends, however long they are.
        Until its first bytes the wait is watched (:meth:`_watched`); after them, ``read_s``
        without a byte is a timeout. No timeout spans a ``yield``: the consumer's own time
        (a slow client) never counts as the engine's silence."""
        pending = b""
        begun = False
        while True:
            if begun:
                try:
                    async with asyncio.timeout(t.read_s):
                        chunk = await response.content.readany()
                except TimeoutError:
                    raise EngineTimedOut(
                        f"the engine at {base_url} sent nothing for {t.read_s:g} s mid-answer"
                    ) from None
            else:
                chunk = await self._watched(
                    response.content.readany(), base_url=base_url, t=t, began=began
                )
            if not chunk:
                break
            begun = True
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if pending:
            yield pending.rstrip(b"\r").decode("utf-8", "replace")

    async def _watched(
        self, work: Awaitable[T], *, base_url: str, t: EngineTimeouts, began: float
    ) -> T:
        """``work``, a wait for an answer to begin that started at ``began`` (loop time), while
        the engine may legitimately be silent. Every ``read_s`` of it the engine's health is
        checked: EngineTimedOut when the check fails, or ``answer_s`` after ``began``. Cancelling
        this (the client went away) or giving up cancels ``work``, which closes its connection:
        the engine drops the request."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(work)
        try:
            while True:
                left = began + t.answer_s - loop.time()
                if left <= 0:
                    raise EngineTimedOut(
                        f"the engine at {base_url} did not begin to answer in {t.answer_s:g} s"
                    )
                done, _ = await asyncio.wait((task,), timeout=min(t.read_s, left))
                if done:
                    return task.result()
                if left > t.read_s and not await self._healthy(base_url, t) and not task.done():
                    raise EngineTimedOut(
                        f"the engine at {base_url} sent nothing for {t.read_s:g} s and did not "
                        f"pass its health check ({HEALTH_PATH}) in {t.read_s:g} s"
                    )
        finally:
            task.cancel()  # nothing when it is done

    async def _healthy(self, base_url: str, t: EngineTimeouts) -> bool:
        """Whether the engine at ``base_url`` still makes progress. One check at a time per
        engine and event loop, shared by every request waiting on it; a check that started less
        than ``read_s / 2`` ago counts for those that ask after it."""
        loop = asyncio.get_running_loop()
        checks = self._checks.setdefault(loop, {})
        latest = checks.get(base_url)
        if latest is None or (latest[1].done() and loop.time() - latest[0] > t.read_s / 2):
            latest = (loop.time(), loop.create_task(self._health_check(base_url, t)))
            checks[base_url] = latest
        # Shielded: a request that goes away does not cancel the others' check.
        return await asyncio.shield(latest[1])

    async def _health_check(self, base_url: str, t: EngineTimeouts) -> bool:
        """``GET /health_generate`` answers within ``read_s``: 200, or a status other than a
        5xx (an engine without that check: silence can then only end at ``answer_s``)."""
        url = base_url.rstrip("/") + HEALTH_PATH
        timeout = aiohttp.ClientTimeout(total=t.read_s, sock_connect=t.connect_s)
        try:
            async with self._client().get(url, timeout=timeout) as response:
                return response.status < 500
        except (*_TRANSPORT_ERRORS, OSError):
            return False

    # --- the control path and /metrics (docs/engines.md, "The engine contract"): one-off calls --

    async def control(
        self,
        *,
        base_url: str,
        policy: str,
        reserve: float,
        token: str | None,
        timeout_s: float,
        wait_bound_s: float = 0.0,
    ) -> None:
        """``POST CONTROL_PATH`` (the market's policy, reserve in $/s and wait bound in s, from
        the next round).
        EngineUnavailable when unreachable or a 5xx (worth retrying); EngineRejected for any
        other refusal (a wrong token's 401, an engine without the endpoint's 404, a 400)."""
        url = base_url.rstrip("/") + CONTROL_PATH
        headers = dict(_JSON)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        payload = json.dumps(
            control_body(policy=policy, reserve=reserve, wait_bound_s=wait_bound_s)
        ).encode()
        status, content = await self._once("POST", url, timeout_s, data=payload, headers=headers)
        if status >= 500:
            raise EngineUnavailable(f"{url}: HTTP {status}", status=status)
        if status >= 400:
            message, param = _error_fields(content)
            raise EngineRejected(f"{url}: HTTP {status}: {message}", param=param, status=status)

    async def metrics(self, *, base_url: str, timeout_s: float) -> str:
        """The engine's ``GET /metrics`` (Prometheus text); EngineUnavailable on any failure."""
        url = base_url.rstrip("/") + METRICS_PATH
        status, content = await self._once("GET", url, timeout_s)
        if status != 200:
            raise EngineUnavailable(f"{url}: HTTP {status}", status=status)
        return content.decode("utf-8", "replace")

    async def _once(
        self, method: str, url: str, timeout_s: float, **kwargs: Any
    ) -> tuple[int, bytes]:
        """The status and body of a one-off call; EngineUnavailable when it fails on the way."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._client().request(method, url, timeout=timeout, **kwargs) as response:
                return response.status, await response.read()
        except (*_TRANSPORT_ERRORS, OSError) as exc:
            raise _transport_error(exc, url) from exc

    def call_sync(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run ``call()`` (one of the methods above) from synchronous code: a Celery task, the
        periodic publisher. On an event loop of its own, whose connections are closed after; in
        a thread of its own when this thread already runs a loop."""

        async def once() -> T:
            try:
                return await call()
            finally:
                await self.aclose()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(once())
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-call") as pool:
            return pool.submit(asyncio.run, once()).result()


def _http_timeout(t: EngineTimeouts) -> aiohttp.ClientTimeout:
    """aiohttp's part of ``t``: connecting. Silence and the answer's wait are the client's
    own (:meth:`EngineClient._watched`), as aiohttp's read timeout cannot tell the two apart."""
    return aiohttp.ClientTimeout(total=None, sock_connect=t.connect_s, sock_read=None)


_default = EngineClient()


def engine_client() -> EngineClient:
    """The process-wide engine client (its connection pools are per event loop)."""
    return _default
