"""The simulated engine on a real clock: the asyncio loop behind the HTTP server.

Clock: engine seconds = the Unix time when the server started + elapsed wall seconds x ``speed``
(elapsed from the monotonic clock, so a wall-clock jump does not move the engine). With speed 1
engine time is Unix time; with speed 20 every step sleeps 1/20 of its modelled duration, and every
time the server reports (latencies, round times, planned completions) is in engine seconds.

The loop: while the engine is idle it waits on an event that a new request sets; otherwise it calls
``engine.step(now)``, sleeps until the clock reaches the step's end, then delivers the step's
effects to the waiting handlers (their ``Ticket`` queues) and hands the round record, if any, to the
sink. Requests are submitted as they arrive, so they take part in the next step's round. Everything
runs in one event loop thread, so the engine needs no locks.

A busy engine runs its steps back to back, as a GPU does: the next step starts where the last one
ended (or at the latest arrival, if later), not at whatever the clock reads when the loop gets
round to it. Otherwise the event loop's own overhead (timers wake at 1 ms resolution) would be added
to every step, and multiplied by ``speed``. Sleeps aim at absolute times, so that overhead does not
accumulate either; only when the loop falls more than ``MAX_LAG_WALL_S`` behind the clock (a CPU too
slow for the speed) does the engine's time jump forward to keep up.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engines.contract.records import RoundRecord
from engines.contract.sinks import FanoutSink

from .engine import Engine, SimRequest, StepResult

log = logging.getLogger(__name__)

HEALTH_RID_PREFIX = "HEALTH_CHECK_"  # /health_generate's probes; left out of round records
DEFAULT_MAX_QUEUE = 4096
RETRY_POLL_S = 0.05  # wall seconds to wait when a step could not run (nothing admissible yet)
MAX_LAG_WALL_S = 0.05  # how far a busy engine's time may fall behind its clock, wall seconds


class EngineClock:
    """Engine time in seconds; ``speed`` engine seconds pass per wall second."""

    def __init__(self, speed: float = 1.0) -> None:
        if not (isinstance(speed, int | float) and math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed must be a finite number > 0, got {speed!r}")
        self.speed = float(speed)
        self._unix0 = time.time()
        self._mono0 = time.monotonic()

    def now(self) -> float:
        """The engine's time, seconds (Unix time when speed is 1)."""
        return self._unix0 + (time.monotonic() - self._mono0) * self.speed

    async def sleep_until(self, t: float) -> None:
        """Sleep until the engine clock reads ``t``."""
        delay = (t - self.now()) / self.speed
        await asyncio.sleep(max(delay, 0.0))  # 0 still lets the handlers run


class EngineDown(RuntimeError):
    """The engine loop has stopped (a bug in a step, or shutdown)."""


class QueueFull(RuntimeError):
    """The waiting queue is at its limit; try again later."""


class DuplicateRequest(ValueError):
    """A live request already has this id."""


@dataclass(eq=False)
class Ticket:
    """A handler's view of its request: events arrive on ``events``.

    An event is an int (tokens generated so far; streams only), ``None`` (finished) or an
    ``EngineDown`` (the engine stopped before finishing it).
    """

    req: SimRequest
    stream: bool
    events: asyncio.Queue[int | None | EngineDown] = field(default_factory=asyncio.Queue)
    abandoned: bool = False  # the client went away while it was running: output is dropped
    done: bool = False


class EngineLoop:
    """Runs an Engine on an EngineClock, feeding tickets and the round-record sink."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: EngineClock,
        sink: FanoutSink,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.sink = sink
        self.max_queue = max_queue
        self.live: dict[str, Ticket] = {}
        self.failure: BaseException | None = None
        self.finished_listeners: list[Callable[[SimRequest], None]] = []
        # Tallies for /metrics.
        self.revenue = 0.0  # priority charges of admitted requests, dollars
        self.records = 0  # round records handed to the sink
        self.cancelled = 0  # waiting requests whose client went away
        self.abandoned_outputs = 0  # running requests whose client went away
        self.steps_done = 0  # steps whose effects have been delivered
        self.last_step_end = 0.0  # engine seconds
        self.latest_arrival = 0.0  # engine seconds
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop as a task of the running event loop."""
        self._task = asyncio.create_task(self._run(), name="sim-engine-loop")

    async def stop(self) -> None:
        """Stop the loop; handlers still waiting get EngineDown."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._fail_all(EngineDown("the engine is shutting down"))

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done() and self.failure is None

    # --- requests in --------------------------------------------------------------------------

    def submit(
        self,
        rid: str,
        tokens: Sequence[int],
        max_new_tokens: int,
        bid: float,
        *,
        stream: bool,
        owner: str = "",
    ) -> Ticket:
        """Queue a request for the next round; raises EngineDown, DuplicateRequest, QueueFull,
        or ValueError (from the engine: it can never fit)."""
        if not self.alive:
            raise EngineDown("the engine is not running")
        if rid in self.live:
            raise DuplicateRequest(f"a request with rid {rid!r} is already in progress")
        if len(self.engine.waiting) >= self.max_queue:
            raise QueueFull(f"the waiting queue is full ({self.max_queue} requests)")
        now = self.clock.now()
        req = SimRequest(rid, tuple(tokens), max_new_tokens, bid=bid, arrival=now, owner=owner)
        self.engine.submit(req)
        self.latest_arrival = max(self.latest_arrival, now)
        ticket = Ticket(req, stream)
        self.live[rid] = ticket
        self._wake.set()
        return ticket

    def abandon(self, ticket: Ticket) -> None:
        """The client went away: cancel the request if it waits, else drop its output."""
        if ticket.done:
            return
        if self.engine.cancel(ticket.req.id):
            ticket.done = True
            self.live.pop(ticket.req.id, None)
            self.cancelled += 1
        elif not ticket.abandoned:
            ticket.abandoned = True
            self.abandoned_outputs += 1

    # --- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        engine, clock = self.engine, self.clock
        max_lag = MAX_LAG_WALL_S * clock.speed
        try:
            while True:
                if engine.idle:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                now = max(self.last_step_end, self.latest_arrival, clock.now() - max_lag)
                result = engine.step(now)
                if result is None:
                    # Nothing could run (no admissible request yet): wait for news, briefly.
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), RETRY_POLL_S)
                    except TimeoutError:
                        pass
                    continue
                await clock.sleep_until(result.end)
                self.last_step_end = result.end
                self._deliver(result)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.exception("the simulated engine failed; it serves no more requests")
            self.failure = exc
            self._fail_all(EngineDown(f"the engine failed: {exc!r}"))

    def _deliver(self, result: StepResult) -> None:
        self.steps_done += 1
        if result.record is not None:
            self._emit(result.record)
        live = self.live
        for req in (*result.first_tokens, *result.decoded):
            ticket = live.get(req.id)
            if ticket is not None and ticket.stream and not ticket.abandoned:
                ticket.events.put_nowait(req.generated)
        for req in result.finished:
            ticket = live.pop(req.id, None)
            for listener in self.finished_listeners:
                listener(req)
            if ticket is not None:
                ticket.done = True
                if not ticket.abandoned:
                    ticket.events.put_nowait(None)

    def _emit(self, record: RoundRecord) -> None:
        admitted = record["admitted"]
        self.revenue += sum(a["charge"] for a in admitted)
        kept = [a for a in admitted if not a["request_id"].startswith(HEALTH_RID_PREFIX)]
        if not kept:
            return
        if len(kept) != len(admitted):
            record = {**record, "admitted": kept}
        self.records += 1
        self.sink.offer(record)

    def _fail_all(self, error: EngineDown) -> None:
        for ticket in self.live.values():
            if not ticket.done:
                ticket.done = True
                ticket.events.put_nowait(error)
        self.live.clear()
