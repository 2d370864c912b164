"""Real engines that misbehave, for the timeout tests: TCP servers on real ports, in a thread.

A :class:`StalledEngine` takes every connection and reads the request, then, by ``mode``:

- ``"frozen"``: answers nothing, to anything (``/generate`` and the health check alike): an
  engine whose process stopped;
- ``"stalls"``: answers a streamed ``/generate`` with its first event (one token), then sends
  nothing more; anything else as ``"frozen"``;
- ``"healthy"``: answers ``GET /health_generate`` with 200 at once, and ``/generate`` never: a
  live engine that lost the request.

It counts what it saw: the paths asked, and the ``/generate`` connections the client closed.
:func:`unaccepting_port` is a port whose connections never complete (connecting times out).
:func:`bid_dropping_route` fronts a real engine and loses every request's bid on the way.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
from aiohttp import web

from engines.contract.wire import CUSTOM_PARAMS, auction_read

# What the "stalls" engine streams first: SGLang's shape, one token of a 16-token prompt, and
# (added per request) the bid read from its custom_params, as SGLang's plugin reports it.
FIRST_EVENT = {
    "text": "Hi",
    "meta_info": {
        "id": "x",
        "prompt_tokens": 16,
        "cached_tokens": 0,
        "completion_tokens": 1,
        "finish_reason": None,
    },
}


class StalledEngine:
    """See the module's docstring; ``url`` once started."""

    def __init__(self, mode: str) -> None:
        assert mode in ("frozen", "stalls", "healthy")
        self.mode = mode
        self.paths: list[str] = []
        self.generate_closed = 0  # /generate connections the client closed
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._handlers: dict[asyncio.Task, asyncio.StreamWriter] = {}
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> StalledEngine:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self._server = started.result(timeout=5)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def _close(self) -> None:
        self._server.close()
        for writer in self._handlers.values():
            writer.transport.abort()  # each handler then reads the end and returns
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers[task] = writer
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            length = next(
                (int(v) for k, _, v in (h.partition(":") for h in lines[1:])
                 if k.strip().lower() == "content-length"),
                0,
            )  # fmt: skip
            body = await reader.readexactly(length) if length else b""
            self.paths.append(path)
            if path == "/health_generate" and self.mode == "healthy":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                return
            sent = json.loads(body) if path == "/generate" else {}
            if self.mode == "stalls" and sent.get("stream"):
                first = {**FIRST_EVENT, "meta_info": {**FIRST_EVENT["meta_info"]}}
                custom = sent["sampling_params"].get(CUSTOM_PARAMS)
                first["meta_info"]["bid"] = [auction_read(custom, request_id=sent["rid"]).bid]
                event = b"data: " + json.dumps(first).encode() + b"\n\n"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Connection: close\r\n\r\n" + event
                )
                await writer.drain()
            while await reader.read(65536):  # nothing more is sent: wait for the client to leave
                pass
            if path == "/generate":
                self.generate_closed += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self._handlers.pop(task, None)


@contextmanager
def stalled_engine(mode: str) -> Iterator[StalledEngine]:
    engine = StalledEngine(mode).start()
    try:
        yield engine
    finally:
        engine.stop()


@contextmanager
def unaccepting_port() -> Iterator[int]:
    """A loopback port that listens with a full backlog and never accepts: a new connection's
    handshake is never answered, so connecting hangs until the client's timeout."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    filler = socket.create_connection(server.getsockname(), timeout=2)  # fills the backlog
    try:
        yield server.getsockname()[1]
    finally:
        filler.close()
        server.close()


class BidDroppingRoute:
    """A route to a real engine that loses the bid, as a router that rebuilt the body without
    it would: ``POST /generate`` is forwarded without ``sampling_params.custom_params``;
    anything else as it is. Runs in a thread; ``url`` once started."""

    def __init__(self, engine_url: str) -> None:
        self.engine_url = engine_url
        self.forwarded = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> BidDroppingRoute:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(5)
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    async def _listen(self) -> int:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return self._runner.addresses[0][1]

    async def _close(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.path == "/generate":
            sent = json.loads(body)
            del sent["sampling_params"][CUSTOM_PARAMS]
            body = json.dumps(sent).encode()
            self.forwarded += 1
        async with self._session.request(
            request.method, self.engine_url + request.path_qs, data=body,
            headers={"Content-Type": "application/json"},
        ) as upstream:  # fmt: skip
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            async for part in upstream.content.iter_any():
                await response.write(part)
            await response.write_eof()
            return response


@contextmanager
def bid_dropping_route(engine_url: str) -> Iterator[BidDroppingRoute]:
    route = BidDroppingRoute(engine_url).start()
    try:
        yield route
    finally:
        route.stop()
