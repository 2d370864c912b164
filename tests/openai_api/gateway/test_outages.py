"""Outages of the stores under load (issue 30): PostgreSQL stopped or its connections cut, Redis
stopped, while the production server (uvicorn, two workers) serves bidding requests.

The stores are the tests' real PostgreSQL and Redis, reached through a TCP proxy
(``tests.faults``) that the test takes down and brings back, or whose connections it cuts. What
must hold, whatever the outage: no answer is a 500; what the database could not record is a 503
with ``Retry-After``; every request answered 200 is charged once (its tokens and its priority),
no other is charged; nothing stays held once the database is back; the budget counters equal
the ledger.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import aiohttp
import httpx
import pytest
import redis
from django.conf import settings
from django.db import connection

from accounts.models import (
    BudgetCounter,
    ChargeKind,
    Hold,
    HoldState,
    LedgerEntry,
    Request,
    RequestStatus,
)
from accounts.selectors.ledger_check import ledger_check
from accounts.tasks import autobidders_step
from benchmarks.faults import TcpProxy, proxied
from benchmarks.faults import via as faults_via
from config.celery import app as celery_app
from engines.contract.control import RedisControlStore, now_state
from market.live.send import group_send_many
from market.payloads import market_group
from tests.openai_api.conftest import market_create
from tests.openai_api.gateway.test_served import _database_url, uvicorn_served
from tests.openai_api.helpers import HELLO, wait_until
from tests.personas import logged_in, program_create, world_create
from tests.scheduler_bridge.workers import celery_worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.celery_worker,
]

CLIENTS = 6  # requests in flight at once
BID = Decimal("0.01")


@dataclass(frozen=True)
class Answer:
    at: float  # seconds after the load started, when the answer came
    status: int
    body: dict
    retry_after: str | None


def _bidding(model: str) -> dict:
    """The body of the tests' bidding request."""
    return {"model": model, "messages": HELLO, "max_tokens": 4, "bid": str(BID)}


def _load(base: str, key: str, model: str, seconds: float) -> list[Answer]:
    """CLIENTS loops posting chat completions with a bid for ``seconds``: every answer."""
    answers: list[Answer] = []
    body = _bidding(model)

    async def run() -> None:
        start = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=90)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def client() -> None:
                while time.monotonic() - start < seconds:
                    async with session.post(
                        f"{base}/v1/chat/completions",
                        json=body,
                        headers={"Authorization": f"Bearer {key}"},
                    ) as response:
                        answers.append(
                            Answer(
                                time.monotonic() - start,
                                response.status,
                                await response.json(content_type=None),
                                response.headers.get("Retry-After"),
                            )
                        )
                    await asyncio.sleep(0.02)

            await asyncio.gather(*(client() for _ in range(CLIENTS)))

    asyncio.run(run())
    return answers


def _probe(base: str, key: str, model: str, into: list[Answer], *, at: float) -> None:
    """One bidding request sent now, its answer appended to ``into`` (as sent at ``at`` s)."""
    response = httpx.post(
        f"{base}/v1/chat/completions",
        json=_bidding(model),
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    retry_after = response.headers.get("Retry-After")
    into.append(Answer(at, response.status_code, response.json(), retry_after))


def _at(schedule: list[tuple[float, object]]) -> threading.Thread:
    """Run each ``(seconds, action)`` of ``schedule`` at its time from now, in a thread."""

    def run() -> None:
        start = time.monotonic()
        for at, action in schedule:
            time.sleep(max(0.0, at - (time.monotonic() - start)))
            action()  # type: ignore[operator]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _ledger_checked(tenant, answers: list[Answer]) -> dict[str, int]:
    """The ledger check: each request answered 200 is served and charged once (tokens and
    priority, as its answer says), nothing else is charged, nothing is held, the counters equal
    the ledger. Returns what it counted."""
    served = {a.body["id"].removeprefix("chatcmpl-"): a.body for a in answers if a.status == 200}
    deadline = time.monotonic() + 60
    while held := list(Hold.objects.filter(tenant=tenant, state=HoldState.OPEN)):
        if time.monotonic() > deadline:
            statuses = dict(
                Request.objects.filter(request_id__in=[h.request_id for h in held[:5]]).values_list(
                    "request_id", "status"
                )
            )
            raise AssertionError(f"{len(held)} holds still open 60 s later: {statuses}")
        time.sleep(0.5)
    entries = list(LedgerEntry.objects.filter(tenant=tenant))
    by_kind = Counter((e.request_id, e.kind) for e in entries)
    assert set(by_kind.values()) <= {1}, "a request charged twice"
    charged = {rid for rid, kind in by_kind if kind == ChargeKind.TOKENS}
    assert charged == set(served), (
        f"charged but not answered 200: {sorted(charged - set(served))[:3]}; "
        f"answered 200 but not charged: {sorted(set(served) - charged)[:3]}"
    )
    priority = {e.request_id: e.amount for e in entries if e.kind == ChargeKind.PRIORITY}
    assert set(priority) == set(served)
    for rid, body in served.items():
        assert Decimal(body["auction"]["priority_charge"]) == priority[rid]
    rows = Counter(Request.objects.filter(tenant=tenant).values_list("status", flat=True))
    assert rows[RequestStatus.SERVED] == len(served)
    assert rows[RequestStatus.QUEUED] == 0
    counter = BudgetCounter.objects.get(tenant=tenant, api_key=None)
    assert counter.held == 0
    assert counter.month_spent == sum(e.amount for e in entries)
    check = ledger_check(grace_s=settings.STALE_REQUEST_S)
    assert check.ok, check.lines()
    return {
        "answered_200": len(served),
        "failed_requests": rows[RequestStatus.FAILED],
        "entries": len(entries),
    }


def _no_500(answers: list[Answer]) -> None:
    statuses = Counter(a.status for a in answers)
    assert set(statuses) <= {200, 503}, statuses
    for answer in answers:
        if answer.status == 503:
            assert answer.retry_after and int(answer.retry_after) >= 1, answer
            assert answer.body["error"]["code"] == "database_unavailable", answer.body


@pytest.fixture
def postgres_proxy() -> TcpProxy:
    db = connection.settings_dict
    with proxied(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)) as proxy:
        yield proxy


@pytest.mark.parametrize("fault", ["stopped", "connections cut"])
def test_postgres_outage_under_load_is_503_never_500_and_the_ledger_holds(
    fault, postgres_proxy, sim, tmp_path: Path
) -> None:
    """PostgreSQL away for 6 s (every connection refused), or its connections cut four times
    (a failover), while 6 clients send bidding requests for 14 s to the gateway and a Celery
    worker waits for tasks, both through the proxy."""
    market = market_create(engine_url=sim.url)
    program = program_create("outage", budget="1000")
    via = faults_via(_database_url(), postgres_proxy)
    with (
        celery_worker(tmp_path, env={"DATABASE_URL": via}) as worker,
        uvicorn_served(tmp_path, DATABASE_URL=via) as base,
    ):
        probes: list[Answer] = []
        if fault == "stopped":
            # A request sent 2 s into the outage: the load's own clients may all be waiting
            # out settlements then (those are tried again until the database is back), so
            # this one is what shows a new request's answer while the database is away.
            probe_at = 6.0
            probe = functools.partial(
                _probe, base, program.key, market.served_model, probes, at=probe_at
            )
            schedule = [(4.0, postgres_proxy.down), (probe_at, probe), (10.0, postgres_proxy.up)]
        else:
            schedule = [(t, postgres_proxy.cut) for t in (3.0, 5.0, 7.0, 9.0)]
        faults = _at(schedule)
        answers = _load(base, program.key, market.served_model, seconds=14.0)
        faults.join()
        # The worker's next task reaches the database again (a pacing step reads and writes).
        step = autobidders_step.apply_async(queue=worker.queue)
        assert isinstance(step.get(timeout=30), dict)
    _no_500(answers + probes)
    ok = [a for a in answers if a.status == 200]
    # Served again once the database is back.
    assert [a.status for a in answers if a.at > 12.0] and all(
        a.status == 200 for a in answers if a.at > 12.0
    )
    if fault == "stopped":
        assert [a.status for a in probes] == [503], "the outage was not seen"
    counted = _ledger_checked(program.tenant, answers)
    print(f"postgres {fault}: {Counter(a.status for a in answers)}; {counted}")
    assert counted["answered_200"] == len(ok)


async def _published(base: str, slug: str, cookie: str) -> dict:
    """An engine status sent to the market's group (through the real Redis) as the operator's
    socket on ``base`` receives it (reconnecting, as the page does, until it is accepted)."""
    status = {
        "kind": "engine.status", "market": slug, "at": 1.0, "up": True, "error": "",
        "queue": 7, "running": 1, "cache_hit_rate": None, "tokens_per_second": None,
        "prompt_tokens_per_second": None, "ttft_p50_s": None, "ttft_p99_s": None,
        "window_s": None,
    }  # fmt: skip
    url = base.replace("http://", "ws://") + f"/ws/markets/{slug}/"
    headers = {"Cookie": cookie, "Origin": base}
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.ws_connect(url, headers=headers) as ws:
                    await asyncio.sleep(0.3)  # joined its groups once accepted
                    await asyncio.to_thread(group_send_many, [(market_group(slug), status)])
                    while True:
                        message = await asyncio.wait_for(ws.receive_json(), timeout=10)
                        if message.get("kind") == "engine.status":
                            return message
            except (aiohttp.ClientError, TimeoutError, TypeError):
                assert time.monotonic() < deadline, "no socket got the market's messages"
                await asyncio.sleep(1.0)


def test_redis_outage_loses_no_money_and_everything_comes_back(
    start_sim, unique_slug, tmp_path: Path, client
) -> None:
    """Redis away for 10 s while 6 clients bid for 16 s, with every Redis user of the market on
    it: the gateway (cache, channel layer), the engine (its round records, the control store it
    follows) and a Celery worker (its broker). Money never touches Redis: every request is
    answered 200 and charged once. What Redis carried meanwhile is lost or waits: the round
    records are dropped and counted by the engine, the control change waits for the store; all
    of it flows again once Redis is back, and the worker takes tasks again."""
    real = redis.Redis.from_url(settings.REDIS_URL)
    stream = f"{unique_slug}:rounds"
    url = urllib.parse.urlsplit(settings.REDIS_URL)
    with proxied(url.hostname or "127.0.0.1", url.port or 6379) as proxy:
        via = faults_via(settings.REDIS_URL, proxy)
        RedisControlStore(settings.REDIS_URL, unique_slug).write(now_state("fcfs", 0.0))
        sim = start_sim(
            market=unique_slug, redis_url=via, rounds_stream=stream, follow_control=True
        )
        market = market_create(engine_url=sim.url, slug=unique_slug)
        program = program_create("redis-outage", budget="1000")
        with (
            celery_worker(tmp_path, env={"REDIS_URL": via}) as worker,
            uvicorn_served(tmp_path, REDIS_URL=via) as base,
        ):
            marks: dict[str, float] = {}

            def down() -> None:
                proxy.down()
                marks["stream_at_down"] = real.xlen(stream)
                marks["dropped_at_down"] = sim.call(lambda: sim.server.redis_sink.dropped)
                # An operator's change while the engines cannot read the store.
                RedisControlStore(settings.REDIS_URL, unique_slug).write(
                    now_state("dfs-auction-density", 0.0)
                )

            def up() -> None:
                marks["stream_at_up"] = real.xlen(stream)
                proxy.up()

            faults = _at([(3.0, down), (13.0, up)])
            answers = _load(base, program.key, market.served_model, seconds=16.0)
            faults.join()
            # An operator's socket, opened once Redis is back, gets what the market publishes.
            world = world_create(market_slug=f"{unique_slug}-ws")
            logged_in(client, world, "operator")
            cookie = f"sessionid={client.cookies['sessionid'].value}"
            message = asyncio.run(_published(base, f"{unique_slug}-ws", cookie))
            assert message["queue"] == 7
            # The worker takes tasks again: it answers a ping through the broker.
            wait_until(
                lambda: celery_app.control.ping(destination=[worker.name], timeout=1.0),
                timeout_s=30,
            )
        # Round records of the outage were dropped and counted; they flow again after it.
        dropped = sim.call(lambda: sim.server.redis_sink.dropped) - marks["dropped_at_down"]
        assert dropped > 0
        assert marks["stream_at_up"] == marks["stream_at_down"]
        wait_until(lambda: real.xlen(stream) > marks["stream_at_up"], timeout_s=15)
        # The change written during the outage reached the engine after it.
        wait_until(lambda: sim.call(lambda: sim.server.engine.policy) == "dfs-auction-density")
    assert {a.status for a in answers} == {200}, Counter(a.status for a in answers)
    counted = _ledger_checked(program.tenant, answers)
    print(
        f"redis 10 s: {Counter(a.status for a in answers)}; {counted}; round records dropped "
        f"{dropped}"
    )
