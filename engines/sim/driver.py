"""Virtual time: drive an engine as fast as the CPU allows, jumping the clock over idle spells.

Arrivals come from an ``ArrivalQueue``, which a closed-loop workload (an agent's next turn after
its previous answer) can push to while the run goes on.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from .engine import Engine, SimRequest, StepResult


class ArrivalQueue:
    """Requests to submit, by arrival time (seconds of virtual time)."""

    def __init__(self, requests: list[SimRequest] = ()) -> None:
        self._heap: list[tuple[float, int, SimRequest]] = []
        self._seq = itertools.count()
        for req in requests:
            self.push(req)

    def push(self, req: SimRequest) -> None:
        heapq.heappush(self._heap, (req.arrival, next(self._seq), req))

    def __len__(self) -> int:
        return len(self._heap)

    def next_time(self) -> float:
        return self._heap[0][0]

    def pop_due(self, now: float) -> list[SimRequest]:
        """The requests that have arrived by ``now``, in arrival order."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[2])
        return out


def run_virtual(
    engine: Engine,
    arrivals: ArrivalQueue,
    *,
    on_step: Callable[[StepResult], None] | None = None,
    on_finished: Callable[[SimRequest], None] | None = None,
    start: float = 0.0,
) -> float:
    """Run until every arrival is served; return the virtual time at the end (seconds)."""
    now = start
    while arrivals or not engine.idle:
        for req in arrivals.pop_due(now):
            engine.submit(req)
        result = engine.step(now)
        if result is None:
            if not arrivals:
                break
            now = max(now, arrivals.next_time())
            continue
        now = result.end
        if on_step is not None:
            on_step(result)
        if on_finished is not None:
            for req in result.finished:
                on_finished(req)
    return now
