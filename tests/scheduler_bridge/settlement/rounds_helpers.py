"""Round records on real Redis streams for the consumption tests: unique names, cleaned up after.

Charges are powers of two over a few dollars, so every sum in the tests is exact and easy to
check by hand.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from decimal import Decimal

import redis
from django.conf import settings

from accounts.models import ChargeKind, LedgerEntry
from accounts.services import request_complete, request_open
from scheduler_bridge.settlement.stream import DEAD_SUFFIX
from tests.accounts.factories import admitted, round_record

# Four rounds of two admitted requests each: request -> its priority charge, dollars.
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
CHARGES_TOTAL = Decimal("2.734375")  # 0.25 + 0.125 + 0.5 + 0.0625 + 0.75 + 0.03125 + 1 + 0.015625
HOLD = "1"  # dollars held per request when it is opened


def records(market_slug: str = "test-llm", rounds: int = 4) -> list[dict]:
    """Round k admits r(2k) and r(2k+1) with the charges above."""
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


def requests_open(tenant, market, count: int = 8) -> None:
    """Open r0 .. r(count-1) as the gateway would, each holding ``HOLD`` dollars, and serve
    them (no tokens): a record's charges are then written as it is settled, not left pending
    until the requests complete."""
    for i in range(count):
        request_open(
            request_id=f"r{i}", tenant=tenant, api_key=None, market=market, bid="0.5",
            hold_amount=HOLD, priority_cap=Decimal(HOLD),
        )  # fmt: skip
        request_complete(request_id=f"r{i}", prompt_tokens=0, cached_tokens=0, completion_tokens=0)


def priority_charges() -> dict[str, Decimal]:
    """request id -> its priority charge, asserting there is at most one per request."""
    rows = list(
        LedgerEntry.objects.filter(kind=ChargeKind.PRIORITY).values_list("request_id", "amount")
    )
    ids = [rid for rid, _ in rows]
    assert len(ids) == len(set(ids)), f"a request was charged twice: {sorted(ids)}"
    return dict(rows)


def expected(*ids: str) -> dict[str, Decimal]:
    return {rid: Decimal(CHARGES[rid]) for rid in ids}


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
