"""Round records from a Redis stream to the live consoles, each taken once (docs/mechanism.md,
"Rounds and charging"; docs/operations.md, "Settlement and periodic tasks (Celery)").

Round records move no money: a request's priority charge reaches the ledger with its
settlement by the gateway (``accounts.services.settlement``), from the engine's answer. The
records feed the order books, the rounds' results and the spend ticks.

Engines XADD each round record to a stream (default ``inference-market:rounds``, field
``record``; ``engines.contract.records``). One consumer group (``settlement``) reads it:

- **At least once.** Entries are read with XREADGROUP and acknowledged (XACK) only after they
  were checked and handed to the publisher. A consumer that dies between the two leaves its
  entries in the group's pending list; any other consumer takes them over with XAUTOCLAIM once
  they have been idle ``claim_min_idle_ms``.
- **Nothing blocks.** A malformed record (not JSON, wrong schema, bad amounts) is copied to the
  dead-letter stream ``<stream>:dead`` with its error and acknowledged in one MULTI. A record
  that keeps failing for another reason goes there after ``max_deliveries`` tries.
  A database or Redis outage stops the invocation without acknowledging anything: the entries
  are retried later.

- **Live.** Each record goes to the consoles (``market.live.publisher``): the market's order
  book as a diff, the round's result, and a spend tick for each tenant with a request admitted,
  throttled to two messages a second per market and per tenant.

Each call of :func:`rounds_consume` is bounded (``max_seconds``, ``max_records``), so celery
beat can run it every second (``scheduler_bridge.rounds_consume``), and ``manage.py
rounds_consume`` can loop it in the foreground.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import redis
from django.db import InterfaceError, OperationalError, close_old_connections, connection
from django.utils import timezone

from engines.contract.records import DEFAULT_STREAM, RoundRecord, round_record_loads
from market.live.publisher import RoundsPublisher, default_publisher

logger = logging.getLogger(__name__)

GROUP = "settlement"
DEAD_SUFFIX = ":dead"
DEAD_MAXLEN = 100_000  # entries kept in the dead-letter stream (approximate trimming)
RECORD_FIELD = b"record"
BATCH = 100  # entries per XREADGROUP / XAUTOCLAIM
BLOCK_MS = 200  # how long one XREADGROUP waits for new entries, milliseconds
CLAIM_MIN_IDLE_MS = 30_000  # a pending entry this idle belongs to a dead consumer, milliseconds
MAX_DELIVERIES = 5  # tries before a record that keeps failing is dead-lettered
# A group member with nothing pending and idle this long is a process that is gone (names carry
# the pid, so they never come back): it is removed from the group, milliseconds.
PRUNE_IDLE_MS = 24 * 3600 * 1000
# Called after each record was checked and before it is published and its entry acknowledged:
# the window in which a crash means a redelivery (taken again, which moves no money). Empty in
# production; the worker tests register one (through a module the worker imports) to kill a
# worker there.
AFTER_TAKE: list[Callable[[], None]] = []

TRANSIENT_ERRORS = (OperationalError, InterfaceError, redis.ConnectionError, redis.TimeoutError)


@dataclass
class ConsumeStats:
    """What one call did, counted in stream entries (records) and admitted requests."""

    read: int = 0  # entries handled: new ones plus reclaimed ones
    reclaimed: int = 0  # of those, taken over from a consumer that stopped (XAUTOCLAIM)
    taken: int = 0  # records taken (checked and published) and acknowledged
    dead: int = 0  # records moved to the dead-letter stream
    failed: int = 0  # records left pending after an error (retried after the idle time)
    trimmed: int = 0  # pending entries the stream had already trimmed away (lost upstream)
    admitted: int = 0  # admitted requests in the records taken
    stalled: str = ""  # the transient error that stopped the call early, if any

    def add(self, other: ConsumeStats) -> None:
        """Add ``other``'s counts to these (for a loop of calls)."""
        for f in fields(self):
            if f.type == "int":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        self.stalled = other.stalled or self.stalled

    def add_taken(self, record: RoundRecord) -> None:
        self.taken += 1
        self.admitted += len(record["admitted"])


@dataclass(frozen=True)
class StreamConsumer:
    """Who reads which stream: the group's member ``consumer`` (unique per process)."""

    client: redis.Redis
    stream: str = DEFAULT_STREAM
    group: str = GROUP
    consumer: str = "settlement"

    @property
    def dead_stream(self) -> str:
        """Where malformed and poison records go."""
        return self.stream + DEAD_SUFFIX


def redis_client(url: str, *, timeout_s: float = 5.0) -> redis.Redis:
    """A client for the rounds stream; bytes in, bytes out (a malformed record may not decode)."""
    return redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)


def rounds_group_ensure(*, sc: StreamConsumer) -> bool:
    """Create the stream (if missing) and the consumer group; True when the group is new.

    A new group starts at the stream's first entry, so records written before any consumer
    existed are taken too (taking old ones again is harmless: they move no money).
    """
    try:
        sc.client.xgroup_create(sc.stream, sc.group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
        return False
    logger.info("rounds: created consumer group %s on stream %s", sc.group, sc.stream)
    return True


def rounds_consume(
    *,
    sc: StreamConsumer,
    max_seconds: float = 0.9,
    max_records: int = 1000,
    batch: int = BATCH,
    block_ms: int = BLOCK_MS,
    claim_min_idle_ms: int = CLAIM_MIN_IDLE_MS,
    max_deliveries: int = MAX_DELIVERIES,
    until_idle: bool = False,
    prune_idle_ms: int = PRUNE_IDLE_MS,
    should_stop: Callable[[], bool] = lambda: False,
    publisher: RoundsPublisher | None = None,
) -> ConsumeStats:
    """Take records from the stream for up to ``max_seconds`` (wall) or ``max_records``.

    Each turn first takes over entries idle for ``claim_min_idle_ms`` in other consumers'
    pending lists, else reads new ones (waiting up to ``block_ms``). With ``until_idle`` it
    returns as soon as a turn finds nothing. Never raises for a bad record; a database or Redis
    outage ends the call early with ``stalled`` set. Records taken are published live
    through ``publisher`` (this process's by default), flushed before it returns.
    """
    publisher = publisher or default_publisher()
    stats = ConsumeStats()
    deadline = time.monotonic() + max_seconds
    cursor: bytes | str | None = "0-0"  # where this call's one pass over the pending list is
    try:
        rounds_group_ensure(sc=sc)
        consumers_prune(sc=sc, idle_ms=prune_idle_ms)
        while stats.read < max_records and not should_stop():
            count = min(batch, max_records - stats.read)
            entries: list[Entry] = []
            if cursor is not None:
                cursor, entries = _reclaim(
                    sc=sc, cursor=cursor, count=count, min_idle_ms=claim_min_idle_ms, stats=stats
                )
            if not entries:
                wait_ms = max(1, min(block_ms, int((deadline - time.monotonic()) * 1000)))
                entries = _read_new(sc=sc, count=count, block_ms=wait_ms)
            for entry_id, entry_fields, deliveries in entries:
                stats.read += 1
                _entry_take(
                    sc=sc,
                    entry_id=entry_id,
                    entry_fields=entry_fields,
                    deliveries=deliveries,
                    max_deliveries=max_deliveries,
                    stats=stats,
                    publisher=publisher,
                )
            publisher.tick()
            if (not entries and until_idle) or time.monotonic() >= deadline:
                break
    except TRANSIENT_ERRORS as exc:
        # The database or Redis is away: stop without acknowledging; the pending entries wait.
        logger.warning("rounds: stopping early, will retry: %s", exc)
        stats.stalled = f"{type(exc).__name__}: {exc}"
        db_connection_reset()
    publisher.flush()
    return stats


def db_connection_reset() -> None:
    """After a database error, drop the connection if it is broken (never inside a caller's
    transaction), so the next call opens a fresh one."""
    if not connection.in_atomic_block:
        close_old_connections()


def consumers_prune(*, sc: StreamConsumer, idle_ms: int) -> list[str]:
    """Remove the group's members (not ``sc.consumer``) that have nothing pending and have been
    idle ``idle_ms`` milliseconds; returns their names. Nothing pending: nothing is lost."""
    removed = []
    for member in sc.client.xinfo_consumers(sc.stream, sc.group):
        name = member["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        if name != sc.consumer and member["pending"] == 0 and member["idle"] >= idle_ms:
            sc.client.xgroup_delconsumer(sc.stream, sc.group, name)
            removed.append(name)
    if removed:
        logger.info("rounds: removed %d idle consumers from %s", len(removed), sc.group)
    return removed


Entry = tuple[bytes, dict[bytes, bytes], int]  # (entry id, fields, times delivered)


def _read_new(*, sc: StreamConsumer, count: int, block_ms: int) -> list[Entry]:
    reply = sc.client.xreadgroup(sc.group, sc.consumer, {sc.stream: ">"}, count, block_ms)
    if not reply:
        return []
    # RESP2 answers [[stream, entries]]; RESP3 answers {stream: [entries]}.
    streams = reply.values() if isinstance(reply, dict) else [entries for _, entries in reply]
    return [(eid, ef, 1) for entries in streams for eid, ef in entries if eid is not None]


def _reclaim(
    *, sc: StreamConsumer, cursor: bytes | str, count: int, min_idle_ms: int, stats: ConsumeStats
) -> tuple[bytes | None, list[Entry]]:
    """Take over up to ``count`` entries consumers read but never acknowledged, from ``cursor``
    on. Returns the next cursor (None once the pass reached the end of the pending list, so a
    call retries an entry that keeps failing at most once) and the entries."""
    reply = sc.client.xautoclaim(
        sc.stream, sc.group, sc.consumer, min_idle_ms, start_id=cursor, count=count
    )
    following = None if reply[0] in (b"0-0", "0-0") else reply[0]
    claimed = [(eid, ef) for eid, ef in reply[1] if eid is not None and ef is not None]
    trimmed = list(reply[2]) if len(reply) > 2 else []
    trimmed += [None] * (len(reply[1]) - len(claimed))  # Redis 6.2 answers nil for those
    if trimmed:
        # Redis drops them from the pending list itself: their records are gone (MAXLEN).
        stats.trimmed += len(trimmed)
        logger.error("rounds: %d pending entries were trimmed from %s", len(trimmed), sc.stream)
    if not claimed:
        return following, []
    stats.reclaimed += len(claimed)
    # Their delivery counts (XAUTOCLAIM counted this one); the range may hold others of ours.
    pending = sc.client.xpending_range(
        sc.stream, sc.group, claimed[0][0], claimed[-1][0], 2 * len(claimed) + BATCH, sc.consumer
    )
    deliveries = {p["message_id"]: p["times_delivered"] for p in pending}
    logger.warning("rounds: %s took over %d pending entries", sc.consumer, len(claimed))
    return following, [(eid, ef, int(deliveries.get(eid, 1))) for eid, ef in claimed]


def _entry_take(
    *,
    sc: StreamConsumer,
    entry_id: bytes,
    entry_fields: dict[bytes, bytes],
    deliveries: int,
    max_deliveries: int,
    stats: ConsumeStats,
    publisher: RoundsPublisher,
) -> None:
    """Take one entry (check it, publish it) and acknowledge it, or dead-letter it, or leave it
    pending."""
    try:
        raw = entry_fields.get(RECORD_FIELD)
        if raw is None:
            raise ValueError(f"stream entry has no {RECORD_FIELD.decode()!r} field")
        record = round_record_loads(raw)
    except ValueError as exc:  # malformed: it will never be taken
        _dead_letter(sc=sc, entry_id=entry_id, entry_fields=entry_fields, error=str(exc))
        stats.dead += 1
        return
    except TRANSIENT_ERRORS:
        raise
    except Exception as exc:  # a bug or a data error: retry a few times, then set it aside
        logger.exception("rounds: entry %s failed (delivery %d)", entry_id.decode(), deliveries)
        if deliveries >= max_deliveries:
            error = f"failed {deliveries} times, last: {type(exc).__name__}: {exc}"
            _dead_letter(sc=sc, entry_id=entry_id, entry_fields=entry_fields, error=error)
            stats.dead += 1
        else:
            stats.failed += 1
        return
    for hook in AFTER_TAKE:
        hook()
    publisher.settled(record)
    sc.client.xack(sc.stream, sc.group, entry_id)
    stats.add_taken(record)


def _dead_letter(
    *, sc: StreamConsumer, entry_id: bytes, entry_fields: dict[bytes, bytes], error: str
) -> None:
    """Copy the entry to the dead-letter stream and acknowledge it, atomically."""
    logger.error("rounds: dead-lettering entry %s of %s: %s", entry_id.decode(), sc.stream, error)
    dead = dict(entry_fields)
    dead.update(
        {
            b"dead_source_id": entry_id,
            b"dead_error": error.encode()[:2000],
            b"dead_consumer": sc.consumer.encode(),
            b"dead_at": timezone.now().isoformat().encode(),
        }
    )
    with sc.client.pipeline(transaction=True) as pipe:
        pipe.xadd(sc.dead_stream, dead, maxlen=DEAD_MAXLEN, approximate=True)
        pipe.xack(sc.stream, sc.group, entry_id)
        pipe.execute()
