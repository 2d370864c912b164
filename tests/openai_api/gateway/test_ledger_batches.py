"""The gateway's batches of holds and settlements (``openai_api.gateway.batching``) on the real
event loop's connections, database threads and PostgreSQL: concurrent holds and settlements
written together, each with its own result (a hold a budget refuses refused alone); what arrives
while a batch is written going together in the next (a group commit); a request id twice in one
batch charged once; a batch whose write cannot reach the database failing each of its requests
with the error a lone settlement gets (``DatabaseUnavailable``, a 503), losing nothing, and
settled once when tried again."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from decimal import Decimal

import pytest
from django.db import connections

from accounts.ledger import Outcome, Usage
from accounts.models import (
    BudgetCounter,
    Hold,
    HoldState,
    LedgerEntry,
    Period,
    Request,
    RequestStatus,
)
from accounts.selectors.ledger_check import ledger_check
from accounts.services import (
    BudgetExhausted,
    Opening,
    Served,
    budget_set,
    request_open,
)
from openai_api.gateway import admission, metrics, services
from openai_api.gateway import db as gateway_db
from openai_api.gateway.batching import LedgerBatch
from openai_api.gateway.errors import DatabaseUnavailable
from openai_api.gateway.services import request_settled
from tests.accounts.factories import market_create, priority_charge, tenant_create

pytestmark = pytest.mark.usefixtures("transactional_db", "_threads_closed")

# 100 prompt tokens at $3/M and 10 output tokens at $15/M: $0.00045 of tokens.
USAGE = Usage(prompt_tokens=100, cached_tokens=0, completion_tokens=10)
TOKENS = Decimal("0.00045")


@pytest.fixture
def _threads_closed() -> Iterator[None]:
    yield
    gateway_db.connections_close()  # before the test database goes


def _opened(n: int) -> tuple[list[str], object]:
    market = market_create("batches")
    tenant = tenant_create("batches")
    ids = [f"b-{i}" for i in range(n)]
    for rid in ids:
        request_open(
            request_id=rid, tenant=tenant, api_key=None, market=market, bid="0.001",
            hold_amount="0.001",
        )  # fmt: skip
    return ids, market


class Counted:
    """The gateway's write of a batch of settlements, counting its calls and their sizes."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    async def __call__(self, served: list[Served]):  # type: ignore[no-untyped-def]
        self.sizes.append(len(served))
        return await services._settlements(served)


async def _all(batch: LedgerBatch, served: list[Served]) -> list[object]:
    return await asyncio.gather(*(batch.result(s) for s in served), return_exceptions=True)


def test_concurrent_settlements_are_written_together_each_with_its_result() -> None:
    ids, market = _opened(10)
    write = Counted()
    served = [Served(rid, USAGE, priority_charge("0.0002"), market) for rid in ids]
    # Ten at once, with room for 64 in 50 ms: one write. Then size 4: 4 + 4 + 2.
    results = asyncio.run(_all(LedgerBatch(write, interval_s=0.05, size=64), served[:6]))
    results += asyncio.run(_all(LedgerBatch(write, interval_s=0.05, size=4), served[6:]))
    assert write.sizes == [6, 4]
    assert [r.outcome for r in results] == [Outcome.WRITTEN] * 10
    assert [(r.tokens.amount, r.priority.amount) for r in results] == [
        (TOKENS, Decimal("0.0002"))
    ] * 10
    assert [r.tokens.request_id for r in results] == ids
    write.sizes.clear()
    again = asyncio.run(_all(LedgerBatch(write, interval_s=0.05, size=4), served[:10]))
    assert write.sizes == [4, 4, 2]
    assert [r.outcome for r in again] == [Outcome.DUPLICATE] * 10
    assert LedgerEntry.objects.count() == 20
    assert ledger_check(grace_s=60).ok


def test_concurrent_holds_are_written_together_and_a_refused_one_alone() -> None:
    """A day budget of $0.0025 and four holds of $0.001 at once: one write for the four; the
    first two fit ($0.002 held), the third and the fourth need $0.001 with $0.0005 left: each
    refused, with its own figures."""
    market = market_create("holds")
    tenant = tenant_create("holds")
    budget_set(tenant=tenant, limit=Decimal("0.0025"), period=Period.DAY)
    sizes: list[int] = []

    async def write(openings: list[Opening]):  # type: ignore[no-untyped-def]
        sizes.append(len(openings))
        return await admission._openings(openings)

    openings = [
        Opening(f"h-{i}", tenant, None, market, Decimal("0"), Decimal("0.001")) for i in range(4)
    ]
    results = asyncio.run(_all(LedgerBatch(write, interval_s=0.05, size=64), openings))
    assert sizes == [4]
    assert [type(r) for r in results] == [Request, Request, BudgetExhausted, BudgetExhausted]
    assert [r.figures()["held"] for r in results[2:]] == ["0.002000000"] * 2
    assert BudgetCounter.objects.get(tenant=tenant, api_key=None).held == Decimal("0.002")
    assert Hold.objects.filter(state=HoldState.OPEN).count() == 2
    assert ledger_check(grace_s=60).ok


def test_what_arrives_while_a_batch_is_written_goes_in_the_next() -> None:
    """A group commit, with no wait of its own (interval 0): the first settlement is written
    alone at once; four arriving while its write runs (slowed to 0.3 s here) wait for it and
    are written together right after it."""
    ids, market = _opened(5)
    sizes: list[int] = []

    async def write(served: list[Served]):  # type: ignore[no-untyped-def]
        sizes.append(len(served))
        if len(sizes) == 1:
            await asyncio.sleep(0.3)
        return await services._settlements(served)

    served = [Served(rid, USAGE, priority_charge("0.0002"), market) for rid in ids]

    async def run() -> list[object]:
        batch = LedgerBatch(write, interval_s=0, size=64, kind="group-commit-test")
        first = asyncio.ensure_future(batch.result(served[0]))
        await asyncio.sleep(0.1)  # the first write is running
        rest = await _all(batch, served[1:])
        return [await first, *rest]

    results = asyncio.run(run())
    assert sizes == [1, 4]
    counted = {"kind": "group-commit-test"}
    assert metrics.REGISTRY.get_sample_value("gateway_ledger_batch_size_count", counted) == 2
    assert metrics.REGISTRY.get_sample_value("gateway_ledger_batch_size_sum", counted) == 5
    assert [r.outcome for r in results] == [Outcome.WRITTEN] * 5
    assert ledger_check(grace_s=60).ok


def test_a_batch_waits_for_company_only_when_requests_come_that_fast() -> None:
    """Interval 0.5 s. Settlements 0.6 s apart: each is written alone, at once (no wait: none
    would join it). Then, in a new batch, ten 10 ms apart: the first, with no rate known yet,
    at once; the next comes 10 ms after it, so it waits for company, and the eight after it
    join it. None comes after them: the nine are written once none has come for two mean gaps
    (about 20 ms after the last, which came 80 ms after the second), not after the interval."""
    ids, market = _opened(13)
    sizes: list[int] = []

    async def write(served: list[Served]):  # type: ignore[no-untyped-def]
        sizes.append(len(served))
        return await services._settlements(served)

    served = [Served(rid, USAGE, priority_charge("0.0002"), market) for rid in ids]

    async def spaced(batch: LedgerBatch, items: list[Served], gap_s: float) -> list[float]:
        """Each item asked for ``gap_s`` after the one before; how long each waited."""

        async def one(item: Served) -> float:
            start = time.monotonic()
            await batch.result(item)
            return time.monotonic() - start

        tasks = []
        for item in items:
            tasks.append(asyncio.ensure_future(one(item)))
            await asyncio.sleep(gap_s)
        return list(await asyncio.gather(*tasks))

    async def both() -> tuple[list[float], list[int], list[float]]:
        """The two series on one loop, as in a gateway process (whose connection is warm)."""
        slow = await spaced(LedgerBatch(write, interval_s=0.5, size=64), served[:3], 0.6)
        slow_sizes = list(sizes)
        sizes.clear()
        fast = await spaced(LedgerBatch(write, interval_s=0.5, size=64), served[3:], 0.01)
        return slow, slow_sizes, fast

    slow, slow_sizes, fast = asyncio.run(both())
    assert slow_sizes == [1, 1, 1]
    assert max(slow) < 0.25, slow  # none waited the interval
    assert sizes == [1, 9]
    assert fast[0] < 0.25, fast
    assert 0.09 < fast[1] < 0.4, fast  # the company's 80 ms and two gaps, not the interval
    assert Request.objects.filter(status=RequestStatus.SERVED).count() == 13
    assert ledger_check(grace_s=60).ok


def test_a_request_id_twice_in_one_batch_is_charged_once() -> None:
    ids, market = _opened(2)
    write = Counted()
    charge = priority_charge("0.0002")
    served = [Served(rid, USAGE, charge, market) for rid in [ids[0], ids[1], ids[0]]]
    first, second, replay = asyncio.run(_all(LedgerBatch(write, interval_s=0.05, size=64), served))
    assert write.sizes == [3]
    assert (first.outcome, second.outcome, replay.outcome) == (
        Outcome.WRITTEN, Outcome.WRITTEN, Outcome.DUPLICATE,
    )  # fmt: skip
    assert replay.tokens.pk == first.tokens.pk
    assert LedgerEntry.objects.filter(request_id=ids[0]).count() == 2  # tokens and priority
    assert ledger_check(grace_s=60).ok


def _closed_port() -> int:
    """A local port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_batch_that_cannot_reach_the_database_fails_each_request_and_loses_nothing() -> None:
    ids, market = _opened(5)
    served = [Served(rid, USAGE, priority_charge("0.0002"), market) for rid in ids]
    write = Counted()
    database = connections.settings["default"]
    port = database["PORT"]
    gateway_db.connections_close()  # the threads reconnect, to the port set below
    database["PORT"] = _closed_port()
    try:
        failed = asyncio.run(_all(LedgerBatch(write, interval_s=0.05, size=64), served))
    finally:
        gateway_db.connections_close()
        database["PORT"] = port
    assert write.sizes == [5]  # one write for the five, which failed
    assert all(isinstance(r, DatabaseUnavailable) for r in failed), failed
    assert {(r.status, r.code) for r in failed} == {(503, "database_unavailable")}
    assert not LedgerEntry.objects.exists()
    assert Hold.objects.filter(state=HoldState.OPEN).count() == 5  # nothing lost, nothing charged

    async def settled_again() -> list[object]:  # the gateway's way: tried again, batched
        return await asyncio.gather(*(request_settled(s) for s in served))

    results = asyncio.run(settled_again())
    assert [r.outcome for r in results] == [Outcome.WRITTEN] * 5
    assert LedgerEntry.objects.count() == 10
    assert not Hold.objects.filter(state=HoldState.OPEN).exists()
    assert set(LedgerEntry.objects.values_list("request__status", flat=True)) == {
        RequestStatus.SERVED
    }
    assert ledger_check(grace_s=60).ok
