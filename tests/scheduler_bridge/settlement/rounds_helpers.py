"""Round records on real Redis streams for the consumption tests: unique names, cleaned up after.

Round records move no money: the consumers check them, publish them and acknowledge them. The
tests observe what the consumers do (their stats, the pending list, the dead letters, what a
:class:`RecordingPublisher` was handed) and that the ledger, the holds and the budget counters
stay as the gateway left them (:func:`assert_no_money_moved`, :func:`money_state`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import redis
from django.conf import settings

from accounts.models import BudgetCounter, Hold, HoldState, LedgerEntry, Request, RequestStatus
from accounts.services import request_open
from scheduler_bridge.settlement.stream import DEAD_SUFFIX
from tests.accounts.factories import admitted, round_record

# Four rounds of two admitted requests each: request -> the priority charge its round record
# reports, dollars (what the gateway settles from the engine's answer, never the consumers).
CHARGES: dict[str, str] = {
    "r0": "0.25",
    "r1": "0.125",
    "r2": "0.5",
    "r3": "0.0625",
    "r4": "0.75",
    "r5": "0.03125",
    "r6": "1",
    "r7": "0.015625",
}
HOLD = "1"  # dollars held per request when it is opened
COUNTER_FIELDS = ("tenant_id", "api_key_id", "held", "spent_total") + tuple(
    f"{period}_spent" for period in ("day", "week", "month")
)


def records(market_slug: str = "test-llm", rounds: int = 4) -> list[dict]:
    """Round k (``sim:1:k``) admits r(2k) and r(2k+1) with the charges above."""
    return [
        round_record(
            f"sim:1:{k}",
            [
                admitted(f"r{2 * k}", float(CHARGES[f"r{2 * k}"])),
                admitted(f"r{2 * k + 1}", float(CHARGES[f"r{2 * k + 1}"]), position=1),
            ],
            market=market_slug,
            seq=k + 1,
        )
        for k in range(rounds)
    ]


def round_ids(*rounds: int) -> list[str]:
    """The round ids of :func:`records`' rounds ``rounds``, in that order."""
    return [f"sim:1:{k}" for k in rounds]


def requests_open(tenant, market, count: int = 8) -> None:
    """Open r0 .. r(count-1) as the gateway would, each holding ``HOLD`` dollars, and leave
    them queued (their engine has not answered yet): their holds stay open."""
    for i in range(count):
        request_open(
            request_id=f"r{i}", tenant=tenant, api_key=None, market=market, bid="0.5",
            hold_amount=HOLD, priority_cap=Decimal(HOLD),
        )  # fmt: skip


def money_state() -> dict[str, Any]:
    """Everything that is money: ledger entries, requests' status, holds, budget counters (to
    compare the state before consuming records with the state after)."""
    return {
        "entries": sorted(LedgerEntry.objects.values_list("request_id", "kind", "amount")),
        "requests": sorted(Request.objects.values_list("request_id", "status")),
        "holds": sorted(Hold.objects.values_list("request_id", "state", "amount", "remaining")),
        "counters": sorted(BudgetCounter.objects.values_list(*COUNTER_FIELDS), key=str),
    }


def assert_no_money_moved(count: int = 8) -> None:
    """r0 .. r(count-1), opened by :func:`requests_open`, are as the gateway left them although
    records admitting them were consumed: no ledger entry, each still queued with its hold open
    for all of ``HOLD``, and the tenant's counter holding count x ``HOLD``, nothing spent."""
    assert not LedgerEntry.objects.exists()
    ids = sorted(f"r{i}" for i in range(count))
    assert sorted(Request.objects.values_list("request_id", "status")) == [
        (rid, RequestStatus.QUEUED) for rid in ids
    ]
    holds = Hold.objects.values_list("request_id", "state", "remaining")
    assert sorted(holds) == [(rid, HoldState.OPEN, Decimal(HOLD)) for rid in ids]
    counter = BudgetCounter.objects.get(api_key=None)
    assert counter.held == Decimal(HOLD) * count
    spent = (counter.spent_total, counter.day_spent, counter.week_spent, counter.month_spent)
    assert spent == (0, 0, 0, 0)


class RecordingPublisher:
    """Stands in for ``market.live.publisher.RoundsPublisher``: keeps the records it is handed
    and, with ``probe``, what ``probe()`` said as each came (e.g. the stream's pending count)."""

    def __init__(self, probe: Callable[[], object] | None = None) -> None:
        self.records: list[dict] = []
        self.probed: list[object] = []
        self.flushes = 0
        self._probe = probe

    def settled(self, record: dict) -> None:
        self.records.append(record)
        if self._probe is not None:
            self.probed.append(self._probe())

    def tick(self, *, force: bool = False) -> None:
        pass

    def flush(self, **kwargs: object) -> None:
        self.flushes += 1

    @property
    def round_ids(self) -> list[str]:
        return [r["round_id"] for r in self.records]


class Streams:
    """A unique stream name on the real Redis, with helpers; deleted (with its dead letters)."""

    def __init__(self) -> None:
        self.client = redis.Redis.from_url(settings.REDIS_URL)
        self.name = f"imtest:rounds:{uuid.uuid4().hex[:12]}"
        self.dead = self.name + DEAD_SUFFIX

    def add(self, record: dict | bytes | str) -> bytes:
        """XADD one entry: a record (as JSON) or raw bytes in the ``record`` field."""
        raw = json.dumps(record) if isinstance(record, dict) else record
        return self.client.xadd(self.name, {"record": raw})

    def pending(self, group: str = "settlement") -> int:
        """Entries delivered to the group and never acknowledged."""
        return self.client.xpending(self.name, group)["pending"]

    def close(self) -> None:
        self.client.delete(self.name, self.dead)
        self.client.close()


def streams_fixture() -> Iterator[Streams]:
    """Body of a ``streams`` fixture (each test module declares its own)."""
    s = Streams()
    yield s
    s.close()
