"""Where the real-time server sends round records (scheduler_bridge.contract.records).

Every sink's ``offer`` returns at once: the engine loop calls it between two steps and must never
wait on a consumer. A record a sink cannot take is counted in ``dropped`` and the loop goes on.

- ``CallbackSink``: in-process consumers, called synchronously with each record;
- ``JsonlSink``: one compact JSON record per line, appended to a file;
- ``RedisStreamSink``: XADD to a Redis stream (field ``record``), through a bounded queue drained
  by a background task with short timeouts; when Redis is down the records are dropped, and the
  sink reconnects after a back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from scheduler_bridge.contract.records import DEFAULT_STREAM, RoundRecord, round_record_dumps

log = logging.getLogger(__name__)

STREAM_MAXLEN = 100_000  # approximate (MAXLEN ~): Redis trims whole macro-nodes
QUEUE_SIZE = 10_000  # records waiting for Redis before new ones are dropped
TIMEOUT_S = 0.5  # connect and command timeout, wall seconds
BACKOFF_S = 1.0  # after a failure, records are dropped for this long before reconnecting


class Sink:
    """A consumer of round records. Counts are of records."""

    def __init__(self) -> None:
        self.sent = 0
        self.dropped = 0

    def offer(self, record: RoundRecord) -> None:
        """Take a record without blocking, or count it as dropped."""
        raise NotImplementedError

    async def start(self) -> None:
        """Start background work, if any (called inside the server's event loop)."""

    async def aclose(self) -> None:
        """Stop background work and release connections."""


class CallbackSink(Sink):
    """Calls each registered function with each record, in the engine loop's thread."""

    def __init__(self) -> None:
        super().__init__()
        self.callbacks: list[Callable[[RoundRecord], Any]] = []

    def offer(self, record: RoundRecord) -> None:
        for callback in list(self.callbacks):
            try:
                callback(record)
            except Exception:
                log.exception("round-record callback %r failed", callback)
                self.dropped += 1
                return
        self.sent += 1


class JsonlSink(Sink):
    """Appends each record as one line of JSON to ``path``."""

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self._file = None

    def offer(self, record: RoundRecord) -> None:
        try:
            if self._file is None:
                self._file = self.path.open("a", encoding="utf-8")
            self._file.write(round_record_dumps(record) + "\n")
            self._file.flush()
        except (OSError, ValueError):
            log.exception("cannot write round records to %s", self.path)
            self.dropped += 1
            return
        self.sent += 1

    async def aclose(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class RedisStreamSink(Sink):
    """XADDs each record to a Redis stream without ever blocking the engine loop."""

    def __init__(
        self,
        url: str,
        stream: str = DEFAULT_STREAM,
        *,
        maxlen: int = STREAM_MAXLEN,
        queue_size: int = QUEUE_SIZE,
        timeout_s: float = TIMEOUT_S,
        backoff_s: float = BACKOFF_S,
    ) -> None:
        super().__init__()
        self.url = url
        self.stream = stream
        self.maxlen = maxlen
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.connected = False
        self._queue: asyncio.Queue[RoundRecord] = asyncio.Queue(maxsize=queue_size)
        self._client: aioredis.Redis | None = None
        self._task: asyncio.Task[None] | None = None
        self._down_until = 0.0  # monotonic seconds

    def offer(self, record: RoundRecord) -> None:
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self.dropped += 1

    async def start(self) -> None:
        self._task = asyncio.create_task(self._drain(), name="round-records-to-redis")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._disconnect()

    async def flush(self, timeout_s: float = 5.0) -> None:
        """Wait (wall seconds, at most ``timeout_s``) until the queue has been drained."""
        deadline = time.monotonic() + timeout_s
        while self._queue.qsize() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    @property
    def pending(self) -> int:
        """Records queued for Redis."""
        return self._queue.qsize()

    async def _drain(self) -> None:
        while True:
            record = await self._queue.get()
            if time.monotonic() < self._down_until:
                self.dropped += 1  # Redis failed a moment ago: do not let records pile up
                continue
            try:
                client = self._connect()
                await asyncio.wait_for(
                    client.xadd(
                        self.stream,
                        {"record": round_record_dumps(record)},
                        maxlen=self.maxlen,
                        approximate=True,
                    ),
                    self.timeout_s,
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection refused, timeout, auth, a bad record ...
                self.dropped += 1
                if self.connected or not self._down_until:
                    log.warning("round records: Redis stream %s unavailable: %s", self.stream, exc)
                self.connected = False
                self._down_until = time.monotonic() + self.backoff_s
                await self._disconnect()
            else:
                self.sent += 1
                self.connected = True

    def _connect(self) -> aioredis.Redis:
        if self._client is None:
            self._client = aioredis.Redis.from_url(
                self.url,
                socket_connect_timeout=self.timeout_s,
                socket_timeout=self.timeout_s,
                retry_on_timeout=False,
            )
        return self._client

    async def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()


class FanoutSink:
    """Offers each record to several sinks; its counts are the sums of theirs."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def offer(self, record: RoundRecord) -> None:
        for sink in self.sinks:
            sink.offer(record)

    @property
    def sent(self) -> int:
        return sum(s.sent for s in self.sinks)

    @property
    def dropped(self) -> int:
        return sum(s.dropped for s in self.sinks)

    async def start(self) -> None:
        for sink in self.sinks:
            await sink.start()

    async def aclose(self) -> None:
        for sink in self.sinks:
            await sink.aclose()
