"""Round records, as the consumers take them, to the consoles: books, round results and spend
ticks.

``scheduler_bridge.settlement.stream`` (the consumer of the Redis stream) hands each record to
:meth:`RoundsPublisher.settled` once checked (round records move no money), calls
:meth:`~RoundsPublisher.tick` between reads and :meth:`~RoundsPublisher.flush` before it
returns. Per market, at most one book message and one round result every ``min_interval_s``
(0.5 s): the latest book waits for its turn (an older one waiting is replaced), and round
results add up until sent. Per tenant, at most one spend tick
every ``min_interval_s``, with the rows of every request of theirs admitted since the previous
one.

Publishing never stops the consumers: errors are logged and the next record tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from accounts.models import Request
from engines.contract.records import RoundRecord
from market.live.book import MIN_INTERVAL_S, book_publish, book_rows
from market.live.send import group_send_many
from market.live.spend import spend_ticks_publish
from market.live.whatif import whatif_keep
from market.payloads import BookRow, Payload, RoundResult, market_group
from mechanism.welfare import planned_welfare

logger = logging.getLogger(__name__)

FLUSH_MAX_WAIT_S = 0.6  # a flush waits at most this long for a throttled book's turn


@dataclass
class _Results:
    """Rounds of one market waiting to be sent as one RoundResult."""

    rounds: int = 0
    admitted: int = 0
    revenue: float = 0.0
    welfare: float = 0.0  # planned welfare of the admitted requests (mechanism.welfare)
    last: RoundRecord | None = None

    def add(self, record: RoundRecord) -> None:
        self.rounds += 1
        self.admitted += len(record["admitted"])
        for a in record["admitted"]:
            self.revenue += a["charge"]
            # Added request by request, as the round records come.
            self.welfare += planned_welfare([(a["effective_bid"], a["planned_completion_s"])])
        self.last = record

    def payload(self) -> RoundResult:
        last = self.last
        assert last is not None
        return {
            "kind": "round.result",
            "market": last["market"],
            "at": float(last["time"]),
            "round_id": last["round_id"],
            "rounds": self.rounds,
            "admitted": self.admitted,
            "revenue": self.revenue,
            "welfare": self.welfare,
            "waiting": int(last["waiting"]),
            "policy": last["policy"],
            "reserve": float(last["reserve"]),
        }


class RoundsPublisher:
    """Turns round records into live messages, throttled. Thread-safe."""

    def __init__(
        self, *, min_interval_s: float = MIN_INTERVAL_S, clock: Callable[[], float] = time.time
    ) -> None:
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._lock = threading.RLock()
        self._books: dict[str, tuple[RoundRecord, dict[str, BookRow]]] = {}
        self._results: dict[str, _Results] = {}
        self._results_sent_at: dict[str, float] = {}
        self._spend: dict[int, list[str]] = {}
        self._spend_sent_at: dict[int, float] = {}

    def settled(self, record: RoundRecord) -> None:
        """Take one record (checked by a consumer); publish what is due."""
        try:
            with self._lock:
                market = record["market"]
                rows = book_rows(record)
                if rows is not None:
                    self._books[market] = (record, rows)
                self._results.setdefault(market, _Results()).add(record)
                whatif_keep(record)  # its waiting queue, for the reserve what-if (never raises)
                ids = [a["request_id"] for a in record["admitted"]]
                if ids:
                    for tenant_id, request_id in Request.objects.filter(
                        request_id__in=ids, market__slug=market
                    ).values_list("tenant_id", "request_id"):
                        self._spend.setdefault(tenant_id, []).append(request_id)
            self.tick()
        except Exception:
            logger.exception("live: publishing round %s failed", record.get("round_id"))

    def pending(self) -> bool:
        """Whether anything waits to be sent."""
        with self._lock:
            return bool(self._books or self._results or self._spend)

    def tick(self, *, force: bool = False) -> None:
        """Send what is due (everything but throttled books, with ``force``)."""
        try:
            with self._lock:
                now = self.clock()
                self._books_send()
                self._results_send(now, force=force)
                self._spend_send(now, force=force)
        except Exception:
            logger.exception("live: publishing failed")

    def flush(self, *, max_wait_s: float = FLUSH_MAX_WAIT_S) -> None:
        """Send everything pending, waiting up to ``max_wait_s`` for a throttled book's turn."""
        self.tick(force=True)
        deadline = time.monotonic() + max_wait_s
        while self._books and time.monotonic() < deadline:
            time.sleep(0.05)
            self.tick(force=True)
        with self._lock:
            self._books.clear()  # a later record will bring a newer book anyway

    def _books_send(self) -> None:
        for market, (record, rows) in list(self._books.items()):
            outcome = book_publish(record=record, rows=rows, min_interval_s=self.min_interval_s)
            if outcome not in ("throttled", "busy"):
                del self._books[market]

    def _results_send(self, now: float, *, force: bool) -> None:
        messages: list[tuple[str, Payload]] = []
        for market, results in list(self._results.items()):
            if force or now - self._results_sent_at.get(market, 0.0) >= self.min_interval_s:
                messages.append((market_group(market), results.payload()))
                self._results_sent_at[market] = now
                del self._results[market]
        group_send_many(messages)

    def _spend_send(self, now: float, *, force: bool) -> None:
        due = {
            tenant_id: ids
            for tenant_id, ids in self._spend.items()
            if force or now - self._spend_sent_at.get(tenant_id, 0.0) >= self.min_interval_s
        }
        if not due:
            return
        for tenant_id in due:
            del self._spend[tenant_id]
            self._spend_sent_at[tenant_id] = now
        spend_ticks_publish(requests_by_tenant=due)


_default: RoundsPublisher | None = None
_default_lock = threading.Lock()


def default_publisher() -> RoundsPublisher:
    """This process's publisher (its throttles hold across calls of the consumers)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = RoundsPublisher()
        return _default
