"""Run the simulated engine's HTTP server in a background thread with its own event loop.

For tests and tools that need a real server on a real TCP port inside their own process:

    with ServerThread(ServerOptions.of(port=0, speed=20)) as sim:
        httpx.post(f"{sim.url}/generate", json={"text": "Hi", "sampling_params": {...}})
        sim.call(lambda: sim.server.engine.waiting)  # read engine state in the loop's thread
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import TypeVar

from .server import ServerOptions, SimServer

T = TypeVar("T")
START_TIMEOUT_S = 10.0


class ServerThread:
    """A SimServer on its own event loop in a daemon thread; ``port=0`` picks a free port."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.server: SimServer | None = None
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def url(self) -> str:
        """The server's base URL, e.g. ``http://127.0.0.1:40123``."""
        return f"http://{self.options.host}:{self.port}"

    def start(self) -> ServerThread:
        """Start the thread and wait until the server listens; re-raise a failure to start."""
        started: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._main, args=(started,), name="sim-server", daemon=True
        )
        self._thread.start()
        self.port = started.result(timeout=START_TIMEOUT_S)
        return self

    def _main(self, started: concurrent.futures.Future[int]) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stopped = asyncio.Event()
            try:
                self.server = SimServer(self.options)
                port = await self.server.start()
            except BaseException as exc:
                started.set_exception(exc)
                return
            started.set_result(port)
            await self._stopped.wait()
            await self.server.stop()

        asyncio.run(run())

    def call(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """Run ``fn`` in the server's event loop thread and return its result."""
        assert self._loop is not None

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def stop(self) -> None:
        """Stop the server and join the thread."""
        if self._loop is not None and self._stopped is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
