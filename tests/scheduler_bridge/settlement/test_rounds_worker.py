"""Round records settled by REAL Celery workers into the real PostgreSQL ledger.

The workers are subprocesses on the test database (tests/scheduler_bridge/workers.py), so these
tests commit what they write (``transactional_db``). The kill tests are deterministic: a test
hook (``tests.pause_hooks``) holds the worker after a record's charges have committed
and before its acknowledgement, the test sees the charges land, then SIGKILLs the worker there.
"""

from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from accounts.models import BudgetCounter, Hold, HoldState
from accounts.services import request_complete, request_open
from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
from scheduler_bridge.tasks import rounds_consume
from tests.accounts.factories import admitted, market_create, round_record, tenant_create
from tests.pause_hooks import ROUNDS_PAUSE_FILE_ENV
from tests.scheduler_bridge.settlement.rounds_helpers import (
    CHARGES,
    CHARGES_TOTAL,
    Streams,
    expected,
    priority_charges,
    records,
    requests_open,
    streams_fixture,
)
from tests.scheduler_bridge.workers import celery_worker, wait_until

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.redis,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
]

streams = pytest.fixture(streams_fixture, name="streams")
RESULT_TIMEOUT_S = 60


@pytest.fixture
def opened() -> None:
    requests_open(tenant_create("acme"), market_create())


def consume(worker, streams: Streams, **kwargs):
    """Send one bounded consumption task to ``worker``'s queue."""
    kwargs = {"stream": streams.name, "max_seconds": 30, "until_idle": True} | kwargs
    return rounds_consume.apply_async(kwargs=kwargs, queue=worker.queue)


def test_a_worker_settles_the_stream_and_a_replay_charges_nothing_twice(
    streams: Streams, opened, tmp_path: Path
) -> None:
    entries = records()
    streams.add(entries[0])
    streams.add("{malformed")
    for record in entries[1:]:
        streams.add(record)
    with celery_worker(tmp_path) as worker:
        stats = consume(worker, streams).get(timeout=RESULT_TIMEOUT_S)
        assert (stats["read"], stats["settled"], stats["dead"], stats["charged"]) == (5, 4, 1, 8)
        assert priority_charges() == expected(*CHARGES)
        assert streams.pending() == 0 and streams.client.xlen(streams.dead) == 1
        # The engine sends the whole history again: every request is already charged.
        for record in entries:
            streams.add(record)
        again = consume(worker, streams).get(timeout=RESULT_TIMEOUT_S)
    assert (again["settled"], again["charged"], again["duplicates"]) == (4, 0, 8)
    assert sum(priority_charges().values()) == CHARGES_TOTAL


def test_killing_the_worker_mid_batch_loses_nothing_and_charges_nothing_twice(
    streams: Streams, opened, tmp_path: Path
) -> None:
    for record in records():
        streams.add(record)
    pause = tmp_path / "pause"
    pause.touch()
    with celery_worker(tmp_path, env={ROUNDS_PAUSE_FILE_ENV: str(pause)}) as first:
        consume(first, streams)
        # It read all four entries in one batch, settled the first round (r0, r1: committed),
        # and now waits before acknowledging it.
        wait_until(lambda: len(priority_charges()) == 2, what="the first round's charges")
        assert priority_charges() == expected("r0", "r1")
        assert streams.pending() == 4
        first.kill()
    assert first.process.returncode == -signal.SIGKILL
    pause.unlink()
    assert priority_charges() == expected("r0", "r1") and streams.pending() == 4

    with celery_worker(tmp_path) as second:
        # The dead consumer's entries are taken over once idle for 500 ms.
        wait_until(
            lambda: min_idle_ms(streams) >= 500, what="the dead consumer's entries to go idle"
        )
        stats = consume(second, streams, claim_min_idle_ms=500).get(timeout=RESULT_TIMEOUT_S)
    # Round 0 again (settled, never acknowledged): 2 duplicates; rounds 1-3: 6 new charges.
    assert (stats["reclaimed"], stats["settled"], stats["charged"], stats["duplicates"]) == (
        4,
        4,
        6,
        2,
    )
    assert priority_charges() == expected(*CHARGES)
    assert sum(priority_charges().values()) == CHARGES_TOTAL
    assert streams.pending() == 0
    # Each charge was counted exactly once, and every hold closed with it.
    assert BudgetCounter.objects.get(api_key=None).spent_total == CHARGES_TOTAL
    assert set(Hold.objects.values_list("state", "remaining")) == {(HoldState.SETTLED, 0)}


def test_a_pool_process_killed_mid_task_is_replaced_and_the_task_redelivered(
    streams: Streams, opened, tmp_path: Path
) -> None:
    """acks_late + reject_on_worker_lost: the prefork parent requeues the message of the task
    whose process died, a new process runs it again, and it takes over the entries."""
    for record in records(rounds=2):
        streams.add(record)
    pause = tmp_path / "pause"
    pause.touch()
    with celery_worker(tmp_path, pool="prefork", env={ROUNDS_PAUSE_FILE_ENV: str(pause)}) as worker:
        result = consume(worker, streams, claim_min_idle_ms=0)
        wait_until(lambda: len(priority_charges()) == 2, what="the first round's charges")
        (child,) = worker.children()
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: child not in worker.children(), what="the pool process to go")
        pause.unlink()
        stats = result.get(timeout=RESULT_TIMEOUT_S)  # the same task, run again
        assert worker.process.poll() is None  # the worker itself lives on
    assert (stats["reclaimed"], stats["charged"], stats["duplicates"]) == (2, 2, 2)
    assert priority_charges() == expected("r0", "r1", "r2", "r3")
    assert streams.pending() == 0
    assert "WorkerLostError" in worker.log.read_text()


def test_records_an_engine_writes_to_redis_are_settled_by_a_worker(
    streams: Streams, tmp_path: Path
) -> None:
    """End to end: the simulated engine admits requests the ledger knows, writes its rounds to
    a real stream, and a worker charges each request what its round record says."""
    market, tenant = market_create(), tenant_create("acme")
    bids = {"e0": 0.5, "e1": 0.25, "e2": 0.125, "e3": 0.05, "e4": 0.02, "e5": 0.0}
    for rid, bid in bids.items():
        request_open(
            request_id=rid, tenant=tenant, api_key=None, market=market, bid=str(bid),
            hold_amount="10",
        )  # fmt: skip
    options = ServerOptions.of(
        port=0, speed=50, market=market.slug, reserve=0.01, redis_url=settings.REDIS_URL,
        rounds_stream=streams.name,
    )  # fmt: skip

    def generate(url: str, rid: str) -> int:
        body = {
            "rid": rid,
            "text": "word " * 400 + rid,  # long prompts queue up behind each other: real rounds
            "sampling_params": {"max_new_tokens": 4, "custom_params": {"bid": bids[rid]}},
        }
        return httpx.post(f"{url}/generate", json=body, timeout=30).status_code

    with ServerThread(options) as sim, ThreadPoolExecutor(len(bids)) as pool:
        assert list(pool.map(lambda rid: generate(sim.url, rid), bids)) == [200] * len(bids)
        wait_until(lambda: sim.server.redis_sink.pending == 0, what="the sink to drain")
    for rid in bids:  # served, as the gateway records it (here without a token charge)
        request_complete(request_id=rid, prompt_tokens=0, cached_tokens=0, completion_tokens=0)
    written = {
        adm["request_id"]: adm["charge"]
        for _, entry in streams.client.xrange(streams.name)
        for adm in json.loads(entry[b"record"])["admitted"]
    }
    assert set(written) >= set(bids)
    with celery_worker(tmp_path) as worker:
        stats = consume(worker, streams).get(timeout=RESULT_TIMEOUT_S)
    assert stats["charged"] == len(bids) and stats["dead"] == 0
    nano = Decimal("1E-9")  # the ledger's rounding: exact float value, to 9 places, half-even
    assert priority_charges() == {rid: Decimal(written[rid]).quantize(nano) for rid in bids}


def min_idle_ms(streams: Streams) -> int:
    """The smallest idle time among the group's pending entries, milliseconds."""
    pending = streams.client.xpending_range(streams.name, "settlement", "-", "+", 100)
    return min(p["time_since_delivered"] for p in pending)


def test_a_lagging_worker_never_lets_a_budget_be_overspent(
    streams: Streams, tmp_path: Path
) -> None:
    """Issue 12's overspend: the gateway keeps admitting and completing requests while their
    round records wait in the stream (no worker running), then a worker settles them late, in
    reverse order and twice. The key's budget ($0.003 a day) holds throughout.

    Each request holds 0.0006 as the gateway would (tokens 0.0001 + priority cap 0.0005) and is
    served with 20 prompt tokens ($3/M: 0.00006); the engine then reports 0.0009 for each, over
    its cap. A served request keeps its cap reserved until its priority charge settles, so
    after n requests 0.00056 n is spent or held, and the next fits while 0.00056 n + 0.0006 <=
    0.003: n = 0..4, five requests. (When the token charge closed the hold, all 30 went through
    and their late priority charges made 30 x 0.0005 + 30 x 0.00006 = 0.0168, 5.6x the budget.)
    """
    from accounts.selectors import budget_status
    from accounts.services import BudgetExhausted, api_key_create, budget_set

    market, tenant = market_create(), tenant_create("acme")
    budget_set(tenant=tenant, limit="1", period="day")
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None, budget_limit="0.003")
    admitted_ids, refused = [], 0
    for i in range(30):
        rid = f"lag{i}"
        try:
            request_open(
                request_id=rid, tenant=tenant, api_key=key, market=market, bid="0.00001",
                hold_amount="0.0006", priority_cap=Decimal("0.0005"),
            )  # fmt: skip
        except BudgetExhausted:
            refused += 1
            continue
        admitted_ids.append(rid)
        request_complete(request_id=rid, prompt_tokens=20, cached_tokens=0, completion_tokens=0)
    assert (len(admitted_ids), refused) == (5, 25)
    lagging = [
        round_record(f"sim:9:{i}", [admitted(rid, 0.0009)], market=market.slug, seq=i + 1)
        for i, rid in enumerate(admitted_ids)
    ]
    for record in [*reversed(lagging), *lagging]:  # late, reordered, replayed
        streams.add(record)
    with celery_worker(tmp_path) as worker:
        stats = consume(worker, streams).get(timeout=RESULT_TIMEOUT_S)
    assert (stats["charged"], stats["duplicates"]) == (5, 5)
    # Each priority charge is its cap, with the engine's figure kept; 5 x 0.00056 = 0.0028.
    assert priority_charges() == dict.fromkeys(admitted_ids, Decimal("0.0005"))
    status = budget_status(tenant=tenant, api_key=key)
    assert (status.spent, status.held) == (Decimal("0.0028"), Decimal(0))
    assert status.spent <= Decimal("0.003")
    assert set(Hold.objects.values_list("state", flat=True)) == {HoldState.SETTLED}
