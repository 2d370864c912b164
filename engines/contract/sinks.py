"""Where an engine sends its round records: one family of sinks for both engines.

An engine's scheduler calls ``offer`` between two steps (the simulated engine's event loop,
SGLang's synchronous scheduler loop that drives the GPU), so ``offer`` never waits: a record a
sink cannot take now is counted and dropped, and the engine goes on. The sinks that write to a
file or to Redis put the record on a bounded queue that a daemon thread drains.

- :class:`MemorySink`: keeps the last records in memory (no destination configured; tests);
- :class:`CallbackSink`: in-process consumers, called with each record in the engine's thread;
- :class:`JsonlSink`: one compact JSON record per line, appended to a file;
- :class:`RedisStreamSink`: XADD to a Redis stream (field ``record``) with short timeouts; while
  Redis is down what arrives is dropped, and it reconnects after a back-off;
- :class:`FanoutSink`: several of these at once.

One set of counters, of records, for every sink (``stats()``, the engines' metrics):
``sent``; ``dropped_queue_full``, a full queue at ``offer``; ``dropped_destination_down``, the
destination failed (Redis refused or timed out or was in its back-off, the file could not be
written, a callback raised); ``pending``, queued and not yet written.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from engines.contract.records import DEFAULT_STREAM, RoundRecord, round_record_dumps

log = logging.getLogger(__name__)

STREAM_MAXLEN = 100_000  # approximate (MAXLEN ~): Redis trims whole macro-nodes
QUEUE_SIZE = 1000  # records waiting for their destination before new ones are dropped
TIMEOUT_S = 0.5  # Redis connect and command timeout, wall seconds
BACKOFF_S = 1.0  # after a failure, records are dropped for this long before reconnecting


class Sink:
    """A consumer of round records; the counters are of records."""

    def __init__(self) -> None:
        self.sent = 0
        self.dropped_queue_full = 0
        self.dropped_destination_down = 0

    def offer(self, record: RoundRecord) -> None:
        """Take a record without blocking, or count it as dropped."""
        raise NotImplementedError

    @property
    def pending(self) -> int:
        """Records taken and not yet written."""
        return 0

    @property
    def dropped(self) -> int:
        return self.dropped_queue_full + self.dropped_destination_down

    def stats(self) -> dict[str, int]:
        """The counters, for logs and metrics."""
        return {
            "sent": self.sent,
            "dropped_queue_full": self.dropped_queue_full,
            "dropped_destination_down": self.dropped_destination_down,
            "pending": self.pending,
        }

    def start(self) -> None:
        """Start background work, if any (it also starts at the first ``offer``)."""

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait (wall seconds, at most ``timeout_s``) until what was offered is written."""
        return True

    def close(self, timeout_s: float = 1.0) -> None:
        """Write what is queued (waiting at most ``timeout_s``), then stop and release."""


class MemorySink(Sink):
    """Keeps the last ``keep`` records in ``records``."""

    def __init__(self, keep: int = 100) -> None:
        super().__init__()
        self.records: deque[RoundRecord] = deque(maxlen=keep)

    def offer(self, record: RoundRecord) -> None:
        self.records.append(record)
        self.sent += 1


class CallbackSink(Sink):
    """Calls each function of ``callbacks`` with each record, in the engine's thread."""

    def __init__(self) -> None:
        super().__init__()
        self.callbacks: list[Callable[[RoundRecord], Any]] = []

    def offer(self, record: RoundRecord) -> None:
        for callback in list(self.callbacks):
            try:
                callback(record)
            except Exception:
                log.exception("round-record callback %r failed", callback)
                self.dropped_destination_down += 1
                return
        self.sent += 1


class QueuedSink(Sink):
    """A sink whose writes happen on a daemon thread that drains a bounded queue."""

    thread_name = "round-records"

    def __init__(self, *, queue_size: int = QUEUE_SIZE) -> None:
        super().__init__()
        self._queue: queue.Queue[RoundRecord | None] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def offer(self, record: RoundRecord) -> None:
        """Queue the record, or count it as dropped; never blocks."""
        if self._thread is None:
            self.start()
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped_queue_full += 1
            if self.dropped_queue_full in (1, 10, 100) or self.dropped_queue_full % 1000 == 0:
                log.warning(
                    "round records: the queue of %s is full, %d dropped so far",
                    self,
                    self.dropped_queue_full,
                )

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._drain, name=self.thread_name, daemon=True
                )
                self._thread.start()

    def flush(self, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.005)
        return False

    def close(self, timeout_s: float = 1.0) -> None:
        thread = self._thread
        if thread is not None:
            try:
                self._queue.put(None, timeout=timeout_s)
            except queue.Full:
                pass
            thread.join(timeout_s)
        self._release()

    def _drain(self) -> None:
        while True:
            record = self._queue.get()
            try:
                if record is None:
                    return
                self._write(record)
            finally:
                self._queue.task_done()

    def _write(self, record: RoundRecord) -> None:
        """Write one record on the drain thread, counting it sent or dropped; never raises."""
        raise NotImplementedError

    def _release(self) -> None:
        """Release connections and files once the thread has stopped."""


class JsonlSink(QueuedSink):
    """Appends each record as one line of JSON to ``path`` (what the benchmarks read; the market
    takes round records from the Redis stream only)."""

    thread_name = "round-records-jsonl"

    def __init__(self, path: str | Path, *, queue_size: int = QUEUE_SIZE) -> None:
        super().__init__(queue_size=queue_size)
        self.path = Path(path)
        self._file: TextIO | None = None

    def __str__(self) -> str:
        return f"the round-records file {self.path}"

    def _write(self, record: RoundRecord) -> None:
        try:
            if self._file is None:
                self._file = self.path.open("a", encoding="utf-8")
            self._file.write(round_record_dumps(record) + "\n")
            self._file.flush()
        except (OSError, ValueError):
            log.exception("round records: cannot write %s", self.path)
            self.dropped_destination_down += 1
        else:
            self.sent += 1

    def _release(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()


class RedisStreamSink(QueuedSink):
    """XADDs each record to the Redis stream ``stream``."""

    thread_name = "round-records-redis"

    def __init__(
        self,
        url: str,
        stream: str = DEFAULT_STREAM,
        *,
        queue_size: int = QUEUE_SIZE,
        maxlen: int = STREAM_MAXLEN,
        timeout_s: float = TIMEOUT_S,
        backoff_s: float = BACKOFF_S,
    ) -> None:
        super().__init__(queue_size=queue_size)
        self.url = url
        self.stream = stream
        self.maxlen = maxlen
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.connected = False
        self._client: redis.Redis | None = None
        self._down_until = 0.0  # monotonic seconds

    def __str__(self) -> str:
        return f"the Redis stream {self.stream}"

    def _write(self, record: RoundRecord) -> None:
        if time.monotonic() < self._down_until:
            self.dropped_destination_down += 1  # Redis failed a moment ago: do not pile up
            return
        try:
            client = self._connect()
            client.xadd(
                self.stream,
                {"record": round_record_dumps(record)},
                maxlen=self.maxlen,
                approximate=True,
            )
        except Exception as exc:  # refused, timeout, auth, a record that is not JSON ...
            self.dropped_destination_down += 1
            if self.connected or not self._down_until:
                log.warning("round records: Redis stream %s unavailable: %s", self.stream, exc)
            self.connected = False
            self._down_until = time.monotonic() + self.backoff_s
            self._release()
        else:
            self.sent += 1
            self.connected = True

    def _connect(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(
                self.url,
                socket_connect_timeout=self.timeout_s,
                socket_timeout=self.timeout_s,
                retry_on_timeout=False,
                retry=Retry(NoBackoff(), 0),  # the back-off above is the only retry
            )
        return self._client

    def _release(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass


class FanoutSink(Sink):
    """Offers each record to each of ``sinks``; its counters are the sums of theirs."""

    def __init__(self, sinks: list[Sink]) -> None:  # no counters of its own
        self.sinks = sinks

    def offer(self, record: RoundRecord) -> None:
        for sink in self.sinks:
            sink.offer(record)

    @property
    def sent(self) -> int:  # type: ignore[override]
        return sum(sink.sent for sink in self.sinks)

    @property
    def dropped_queue_full(self) -> int:  # type: ignore[override]
        return sum(sink.dropped_queue_full for sink in self.sinks)

    @property
    def dropped_destination_down(self) -> int:  # type: ignore[override]
        return sum(sink.dropped_destination_down for sink in self.sinks)

    @property
    def pending(self) -> int:
        return sum(sink.pending for sink in self.sinks)

    def start(self) -> None:
        for sink in self.sinks:
            sink.start()

    def flush(self, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        return all(sink.flush(max(0.0, deadline - time.monotonic())) for sink in self.sinks)

    def close(self, timeout_s: float = 1.0) -> None:
        for sink in self.sinks:
            sink.close(timeout_s)


def sink_for(
    redis_url: str | None, stream: str, *, queue_size: int, jsonl_path: str | None = None
) -> Sink:
    """A Redis stream sink when a URL is configured, else a file when a path is, else memory."""
    if redis_url:
        return RedisStreamSink(redis_url, stream, queue_size=queue_size)
    if jsonl_path:
        return JsonlSink(jsonl_path, queue_size=queue_size)
    return MemorySink()
