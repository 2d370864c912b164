"""Round records taken by REAL Celery workers, beside the real PostgreSQL ledger.

The workers are subprocesses on the test database (tests/scheduler_bridge/workers.py), so these
tests commit what they write (``transactional_db``). The kill tests are deterministic: a test
hook (``tests.pause_hooks``) holds the worker after a record was checked and before it is
published and acknowledged, the test sees it get there, then SIGKILLs the worker there. Round
records move no money: whatever the workers do, the ledger, the holds and the budgets stay as
the gateway left them.
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

from accounts.models import HoldState, LedgerEntry
from accounts.services import request_open, request_settle
from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
from scheduler_bridge.tasks import rounds_consume
from tests.accounts.factories import (
    admitted,
    market_create,
    priority_charge,
    round_record,
    tenant_create,
)
from tests.pause_hooks import ROUNDS_PAUSE_FILE_ENV, rounds_pause_reached
from tests.scheduler_bridge.settlement.rounds_helpers import (
    Streams,
    assert_no_money_moved,
    money_state,
    records,
    requests_open,
    streams_fixture,
)
from tests.scheduler_bridge.workers import celery_worker, wait_until

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.django_db(transaction=True),
]

streams = pytest.fixture(streams_fixture, name="streams")
RESULT_TIMEOUT_S = 60
STATS = {"read", "reclaimed", "taken", "dead", "failed", "trimmed", "admitted", "stalled"}


@pytest.fixture
def opened() -> None:
    requests_open(tenant_create("acme"), market_create())


def consume(worker, streams: Streams, **kwargs):
    """Send one bounded consumption task to ``worker``'s queue."""
    kwargs = {"stream": streams.name, "max_seconds": 30, "until_idle": True} | kwargs
    return rounds_consume.apply_async(kwargs=kwargs, queue=worker.queue)


def test_a_worker_takes_the_stream_and_a_replay_again(
    streams: Streams, opened, tmp_path: Path
) -> None:
    entries = records()
    streams.add(entries[0])
    streams.add("{malformed")
    for record in entries[1:]:
        streams.add(record)
    with celery_worker(tmp_path) as worker:
        stats = consume(worker, streams).get(timeout=RESULT_TIMEOUT_S)
        assert set(stats) == STATS
        # 5 entries: 4 records of 2 admitted requests each, 1 malformed.
        assert (stats["read"], stats["taken"], stats["dead"], stats["admitted"]) == (5, 4, 1, 8)
        assert streams.pending() == 0 and streams.client.xlen(streams.dead) == 1
        # The engine sends the whole history again: taken again, harmlessly.
        for record in entries:
            streams.add(record)
        again = consume(worker, streams).get(timeout=RESULT_TIMEOUT_S)
    assert (again["read"], again["taken"], again["dead"], again["admitted"]) == (4, 4, 0, 8)
    assert streams.pending() == 0 and streams.client.xlen(streams.dead) == 1
    assert_no_money_moved()


def test_killing_the_worker_mid_batch_loses_nothing(
    streams: Streams, opened, tmp_path: Path
) -> None:
    for record in records():
        streams.add(record)
    pause = tmp_path / "pause"
    pause.touch()
    with celery_worker(tmp_path, env={ROUNDS_PAUSE_FILE_ENV: str(pause)}) as first:
        consume(first, streams)
        # It read all four entries in one batch, checked the first (round 0), and now waits
        # before publishing and acknowledging it.
        wait_until(rounds_pause_reached(pause).exists, what="the worker to take round 0")
        assert streams.pending() == 4
        first.kill()
    assert first.process.returncode == -signal.SIGKILL
    pause.unlink()
    assert streams.pending() == 4  # nothing acknowledged, so nothing lost

    with celery_worker(tmp_path) as second:
        # The dead consumer's entries are taken over once idle for 500 ms.
        wait_until(
            lambda: min_idle_ms(streams) >= 500, what="the dead consumer's entries to go idle"
        )
        stats = consume(second, streams, claim_min_idle_ms=500).get(timeout=RESULT_TIMEOUT_S)
    # All four taken over (round 0 a second time: it was never acknowledged), 4 x 2 admitted.
    assert (stats["reclaimed"], stats["taken"], stats["admitted"], stats["dead"]) == (4, 4, 8, 0)
    assert streams.pending() == 0
    assert_no_money_moved()


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
        wait_until(rounds_pause_reached(pause).exists, what="the pool process to take round 0")
        assert streams.pending() == 2
        (child,) = worker.children()
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: child not in worker.children(), what="the pool process to go")
        pause.unlink()
        stats = result.get(timeout=RESULT_TIMEOUT_S)  # the same task, run again
        assert worker.process.poll() is None  # the worker itself lives on
    # Both entries the dead process had read, taken over: 2 records x 2 admitted.
    assert (stats["reclaimed"], stats["taken"], stats["admitted"], stats["dead"]) == (2, 2, 4, 0)
    assert streams.pending() == 0
    assert "WorkerLostError" in worker.log.read_text()
    assert_no_money_moved()


def test_records_an_engine_writes_to_redis_are_taken_by_a_worker(
    streams: Streams, tmp_path: Path
) -> None:
    """End to end: the simulated engine admits requests the ledger knows and writes its rounds
    to a real stream; a worker takes every round, and the requests stay as the gateway left
    them (queued here, their holds open: the gateway settles them from the engine's answers)."""
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
    written = [
        adm["request_id"]
        for _, entry in streams.client.xrange(streams.name)
        for adm in json.loads(entry[b"record"])["admitted"]
    ]
    assert sorted(written) == sorted(bids)  # each of the six admitted in one round
    before = money_state()
    with celery_worker(tmp_path) as worker:
        stats = consume(worker, streams).get(timeout=RESULT_TIMEOUT_S)
    rounds_written = streams.client.xlen(streams.name)
    assert (stats["taken"], stats["admitted"], stats["dead"]) == (rounds_written, 6, 0)
    assert streams.pending() == 0
    assert money_state() == before
    assert not LedgerEntry.objects.exists()
    ten = Decimal("10")
    assert before["holds"] == [(rid, HoldState.OPEN, ten, ten) for rid in sorted(bids)]


def min_idle_ms(streams: Streams) -> int:
    """The smallest idle time among the group's pending entries, milliseconds."""
    pending = streams.client.xpending_range(streams.name, "settlement", "-", "+", 100)
    return min(p["time_since_delivered"] for p in pending)


def test_a_lagging_worker_never_lets_a_budget_be_overspent(
    streams: Streams, tmp_path: Path
) -> None:
    """Issue 12's overspend came from round records settled late. Now the gateway settles both
    charges of each request at once, and round records that reach a worker late, in reverse
    order and twice change nothing: the key's budget ($0.003 a day) holds throughout.

    Each request holds 0.0006 as the gateway would (tokens 0.0001 + priority cap 0.0005) and is
    settled with 20 prompt tokens ($3/M: 0.00006) and the 0.0009 its engine reported, over its
    cap: 0.0005 is written, 0.00056 in all, and its hold closes. After n requests 0.00056 n is
    spent, and the next fits while 0.00056 n + 0.0006 <= 0.003: n = 0..4, five requests.
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
        request_settle(
            request_id=rid, prompt_tokens=20, cached_tokens=0, completion_tokens=0,
            priority=priority_charge(0.0009, round_id=f"sim:9:{len(admitted_ids)}"),
        )  # fmt: skip
    assert (len(admitted_ids), refused) == (5, 25)
    status = budget_status(tenant=tenant, api_key=key)
    assert (status.spent, status.held) == (Decimal("0.0028"), Decimal(0))  # 5 x 0.00056
    before = money_state()
    lagging = [
        round_record(f"sim:9:{i + 1}", [admitted(rid, 0.0009)], market=market.slug, seq=i + 1)
        for i, rid in enumerate(admitted_ids)
    ]
    for record in [*reversed(lagging), *lagging]:  # late, reordered, replayed
        streams.add(record)
    with celery_worker(tmp_path) as worker:
        stats = consume(worker, streams).get(timeout=RESULT_TIMEOUT_S)
    # 5 records of 1 admitted request, each sent twice.
    assert (stats["taken"], stats["admitted"], stats["dead"]) == (10, 10, 0)
    assert money_state() == before
    status = budget_status(tenant=tenant, api_key=key)
    assert (status.spent, status.held) == (Decimal("0.0028"), Decimal(0))
    assert status.spent <= Decimal("0.003")
