"""The ledger writes of concurrent requests, gathered per gateway process into one statement.

Each hold and each settlement is a few rows locked, written and committed; written one
statement per request, the commit and the statement's fixed costs are most of PostgreSQL's
work for a request. The gateway process therefore gathers the holds (and, apart, the
settlements) of its concurrent requests and hands them to the ledger in one call, which writes
them in one statement, as if one after another in the order they arrived (``accounts.ledger``:
each is checked against what the ones before it wrote; a request after one that was not
written as assumed, such as one a budget refused or cut, goes in the next statement).

When a batch is written: a group commit. While none of its kind is being written, the first
request to arrive starts a batch. It waits at most ``GATEWAY_LEDGER_BATCH_S`` seconds for
company when company comes that fast (``COMPANY`` requests of its kind due within that time,
by a moving mean of the gaps between them, ``GAP_WEIGHT``), and only while it comes (written
when none has arrived for ``IDLE_GAPS`` mean gaps); it is written as soon as the event loop
turns when company does not come that fast (the wait would not pay). While one is being written, the
requests that arrive wait for it and go together in the next, written as soon as it is done.
At once, in any case, when ``GATEWAY_LEDGER_BATCH_SIZE`` wait. So at a low rate a request is
written alone without waiting, and as the rate rises, batches grow with it, up to the size.

Each request still gets its own result or its own error; a batch whose write failed (the
database cannot be reached) fails each of its requests with that error: a settlement is tried
again on its own (``db.retried``), in a later batch (settling is idempotent), and a hold that
may have been written is released.

A batch runs in the process's event loop. Its write is the ledger's first statement for the
batch, run on the loop's own connection (``db.statement_run``: no thread hop), which decides
nearly every request; the few it leaves (a refusal, a replay, counter rows to create) are
written by the ledger on a database thread (``db.db_call``), as if on their own after it
(:func:`decided_first`). The write of a batch always finishes, whether or not its requests still
wait.
"""

from __future__ import annotations

import asyncio
import functools
import math
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from django.conf import settings

from accounts.ledger import Statement
from openai_api.gateway import metrics
from openai_api.gateway.db import db_call, detached, statement_run

I = TypeVar("I")  # noqa: E741 (an item of a batch)
R = TypeVar("R")

# The weight of each new gap between two arrivals in their moving mean: the mean follows a
# change of rate within a few tens of arrivals; a pause of 8 intervals ends the waits at once.
GAP_WEIGHT = 1 / 16
# A batch waits for company when this many requests are due within the interval (fewer would
# not pay the wait: one more halves a statement's cost a request, at the wait's price).
COMPANY = 2
# A batch waiting for company is written once none has come for this many mean gaps (the
# requests that were coming have come: a closed loop's burst, the end of a burst).
IDLE_GAPS = 2


class LedgerBatch(Generic[I, R]):
    """Items gathered for one write (``write``: items in arrival order -> each one's result or
    exception, in that order), written at most ``interval_s`` seconds after the first arrived
    when ``COMPANY`` more are due within ``interval_s`` (by the mean gap), and sooner when none has
    come for ``IDLE_GAPS`` mean gaps (else at the next turn of the event loop), or, when a
    write was running then, as soon as it is done; at once when there are ``size``. With a
    ``kind``, each write's size is counted in ``gateway_ledger_batch_size``."""

    def __init__(
        self,
        write: Callable[[list[I]], Awaitable[Sequence[R | Exception]]],
        *,
        interval_s: float,
        size: int,
        kind: str | None = None,
    ) -> None:
        if size < 1 or interval_s < 0:
            raise ValueError(f"a batch needs size >= 1 and interval >= 0 s: {size}, {interval_s}")
        self._write = write
        self.interval_s = interval_s
        self.size = size
        self._pending: list[tuple[I, asyncio.Future[R]]] = []
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._writing = 0  # writes running
        self._gap_s = math.inf  # the moving mean of the gaps between arrivals (loop seconds)
        self._last_at: float | None = None
        self._first_at = 0.0  # when the pending batch's first item arrived
        self._sizes = None if kind is None else metrics.LEDGER_BATCH.labels(kind)

    async def result(self, item: I) -> R:
        """``item``'s result once its batch is written (or the exception for it)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._last_at is not None:
            gap = now - self._last_at
            self._gap_s = (
                gap if self._gap_s == math.inf else self._gap_s + (gap - self._gap_s) * GAP_WEIGHT
            )
        self._last_at = now
        future: asyncio.Future[R] = loop.create_future()
        if not self._pending:
            self._first_at = now
        self._pending.append((item, future))
        if len(self._pending) >= self.size:
            self._flush()
        elif not self._writing:
            if self._gap_s * COMPANY < self.interval_s:  # company comes: wait while it comes
                if self._timer is not None:
                    self._timer.cancel()
                at = min(self._first_at + self.interval_s, now + IDLE_GAPS * self._gap_s)
                self._timer = loop.call_at(at, self._flush)
            elif self._timer is None:
                self._timer = loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            self._writing += 1
            if self._sizes is not None:
                self._sizes.observe(len(batch))
            detached(self._written(batch))

    async def _written(self, batch: list[tuple[I, asyncio.Future[R]]]) -> None:
        try:
            results = await self._write([i for i, _ in batch])
        except Exception as exc:  # noqa: BLE001 (the batch's write failed: each request's error)
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            self._writing -= 1
            if self._pending and not self._writing and self._timer is None:
                self._flush()  # what arrived while it was written: the next batch, now
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():  # its request was cancelled: the write is done all the same
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)


_batches: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[object, LedgerBatch]  # type: ignore[type-arg]
] = weakref.WeakKeyDictionary()


async def decided_first(
    first: Statement[list[R | Exception | None]],
    *,
    lane: str,
    rest: Callable[[list[int]], Sequence[R | Exception]],
) -> list[R | Exception]:
    """A batch's results: its ``first`` statement run on the event loop's connection for
    ``lane``, then ``rest(indices)`` (synchronous: the ledger's own write of the requests at
    those indices, in their order) on a database thread for the requests the statement left
    undecided (it wrote nothing for them)."""
    results = await statement_run(first, lane=lane)
    undecided = [k for k, result in enumerate(results) if result is None]
    if undecided:
        written = await db_call(functools.partial(rest, undecided))
        for k, result in zip(undecided, written, strict=True):
            results[k] = result
    return [r for r in results if r is not None]


def ledger_batch(
    write: Callable[[list[I]], Awaitable[Sequence[R | Exception]]], *, kind: str
) -> LedgerBatch[I, R]:
    """The running event loop's batch for ``write`` (the settings read when it is made), its
    sizes counted as ``kind``'s."""
    loop = asyncio.get_running_loop()
    mine = _batches.setdefault(loop, {})
    batch = mine.get(write)
    if batch is None:
        batch = mine[write] = LedgerBatch(
            write,
            interval_s=settings.GATEWAY_LEDGER_BATCH_S,
            size=settings.GATEWAY_LEDGER_BATCH_SIZE,
            kind=kind,
        )
    return batch
