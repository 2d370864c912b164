"""Where the plugin sends round records, without ever making SGLang's scheduler wait.

The scheduler's event loop is synchronous and runs the GPU: ``offer`` only puts the record on a
bounded queue (or counts it as dropped) and returns. A daemon thread drains the queue into a Redis
stream (XADD, field ``record``, the schema of ``scheduler_bridge.contract.records``) with short
socket timeouts; while Redis is down it drops what arrives, counting, and tries again after a
back-off.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from scheduler_bridge.contract.records import RoundRecord, round_record_dumps

log = logging.getLogger(__name__)

STREAM_MAXLEN = 100_000  # approximate (MAXLEN ~)
TIMEOUT_S = 0.5  # connect and command timeout, wall seconds
BACKOFF_S = 1.0  # after a failure, records are dropped for this long before reconnecting


class MemorySink:
    """Keeps the last ``keep`` records in memory (no Redis configured; tests)."""

    def __init__(self, keep: int = 100) -> None:
        self.records: deque[RoundRecord] = deque(maxlen=keep)
        self.sent = 0

    def offer(self, record: RoundRecord) -> None:
        """Take the record; never blocks."""
        self.records.append(record)
        self.sent += 1

    def stats(self) -> dict[str, int]:
        """Counts of records."""
        return {"sent": self.sent, "dropped_queue_full": 0, "dropped_redis_down": 0}

    def close(self, timeout_s: float = 0.0) -> None:
        """Nothing to release."""


class RedisStreamSink:
    """XADDs round records to a Redis stream from a background thread.

    Counters (records): ``sent``; ``dropped_queue_full`` when the queue was full at ``offer``;
    ``dropped_redis_down`` when Redis refused, timed out or was in its back-off.
    """

    def __init__(
        self,
        url: str,
        stream: str,
        *,
        queue_size: int = 1000,
        maxlen: int = STREAM_MAXLEN,
        timeout_s: float = TIMEOUT_S,
        backoff_s: float = BACKOFF_S,
    ) -> None:
        self.url = url
        self.stream = stream
        self.maxlen = maxlen
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.sent = 0
        self.dropped_queue_full = 0
        self.dropped_redis_down = 0
        self.connected = False
        self._queue: queue.Queue[RoundRecord | None] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._client: redis.Redis | None = None
        self._down_until = 0.0  # monotonic seconds

    def offer(self, record: RoundRecord) -> None:
        """Queue the record for Redis, or count it as dropped; never blocks."""
        if self._thread is None:
            self._start()
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped_queue_full += 1
            if self.dropped_queue_full in (1, 10, 100) or self.dropped_queue_full % 1000 == 0:
                log.warning(
                    "round records: queue for Redis stream %s full, %d dropped so far",
                    self.stream,
                    self.dropped_queue_full,
                )

    @property
    def pending(self) -> int:
        """Records queued for Redis."""
        return self._queue.qsize()

    def stats(self) -> dict[str, int]:
        """Counts of records, for logs and metrics."""
        return {
            "sent": self.sent,
            "dropped_queue_full": self.dropped_queue_full,
            "dropped_redis_down": self.dropped_redis_down,
            "pending": self.pending,
        }

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait (wall seconds, at most ``timeout_s``) until the queue is drained; for tests."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.005)
        return False

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the thread after what is queued (waiting at most ``timeout_s``)."""
        thread = self._thread
        if thread is not None:
            try:
                self._queue.put(None, timeout=timeout_s)
            except queue.Full:
                pass
            thread.join(timeout_s)

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._drain, name="market-round-records", daemon=True
                )
                self._thread.start()

    def _drain(self) -> None:
        while True:
            record = self._queue.get()
            try:
                if record is None:
                    return
                self._send(record)
            finally:
                self._queue.task_done()

    def _send(self, record: RoundRecord) -> None:
        if time.monotonic() < self._down_until:
            self.dropped_redis_down += 1  # Redis failed a moment ago: do not pile up
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
            self.dropped_redis_down += 1
            if self.connected or not self._down_until:
                log.warning("round records: Redis stream %s unavailable: %s", self.stream, exc)
            self.connected = False
            self._down_until = time.monotonic() + self.backoff_s
            self._disconnect()
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

    def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass


class JsonlSink:
    """Appends round records to a file, one JSON object a line, from a background thread (for
    a machine without Redis; ``manage.py rounds_consume --jsonl PATH`` settles such a file)."""

    def __init__(self, path: str, *, queue_size: int = 1000) -> None:
        self.path = path
        self.sent = 0
        self.dropped_queue_full = 0
        self._queue: queue.Queue[RoundRecord] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._drain, name="market-rounds-jsonl", daemon=True)
        self._thread.start()

    def offer(self, record: RoundRecord) -> None:
        """Queue the record for the file, or count it as dropped; never blocks."""
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped_queue_full += 1

    def stats(self) -> dict[str, int]:
        return {"sent": self.sent, "dropped_queue_full": self.dropped_queue_full}

    def close(self, timeout_s: float = 1.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    def _drain(self) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            while True:
                record = self._queue.get()
                try:
                    f.write(round_record_dumps(record) + "\n")
                    f.flush()
                    self.sent += 1
                except OSError:
                    log.exception("round records: cannot write %s", self.path)
                finally:
                    self._queue.task_done()


def sink_for(
    redis_url: str | None, stream: str, *, queue_size: int, jsonl_path: str | None = None
) -> Any:
    """A Redis stream sink when a URL is configured, else a file when a path is, else memory."""
    if redis_url:
        return RedisStreamSink(redis_url, stream, queue_size=queue_size)
    if jsonl_path:
        return JsonlSink(jsonl_path, queue_size=queue_size)
    return MemorySink()
