"""A gateway that stops, or dies, with requests in flight leaves no hold open (issue 45, item 3).

uvicorn as ``config.serving`` runs it (two workers, on the test database and Redis), in a
process group of its own as supervisord runs its programs, in front of a slow simulated engine
(its requests take a minute): requests are in flight, each with its hold, when

- the group gets SIGTERM (supervisord's stop, ``stopasgroup``): uvicorn lets the requests finish
  for ``GRACEFUL_SHUTDOWN_S`` seconds, then cancels the rest, and the gateway releases their holds
  (failed, uncharged) before its workers exit; a request that finished meanwhile is served and
  charged as usual. Before: the holds stayed open until the stale sweep, 20 minutes later.
- the group gets SIGKILL: nothing in the process can release anything, but its heartbeat stops;
  ``TTL_S`` seconds later the lost gateways' sweep (celery beat's ``accounts.gateways_sweep``,
  called here as the worker would) fails those requests, uncharged. Before: 20 minutes.

Either way ``manage.py ledger_check --grace 5`` passes right after. A request whose answer was
complete and is being settled when the stop cuts it off is settled and its answer still sent.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import aiohttp
import pytest
from django.conf import settings
from django.core.management import call_command

from accounts import tasks
from accounts.models import BudgetCounter, Hold, HoldState, LedgerEntry, Request, RequestStatus
from accounts.services import gateways
from config.serving import GRACEFUL_SHUTDOWN_S
from openai_api.gateway import db as gateway_db
from openai_api.gateway import services
from openai_api.gateway.validation import CHAT, completion_params
from tests.conftest import dead_port
from tests.openai_api.conftest import market_create
from tests.openai_api.gateway.test_served import uvicorn_started
from tests.openai_api.helpers import HELLO, entries, request_id_of, request_row, wait_until
from tests.personas import program_create

pytestmark = [pytest.mark.django_db(transaction=True)]
SLOW = 6  # requests on the slow engine: still in flight when the gateway stops
# The simulated engine's forward pass, engine seconds (at the tests' speed, 20 engine seconds
# a wall second): 10 s is 0.5 s of wall time a token, so max_tokens 100 takes ~50 s.
SLOW_STEP = ("step_fixed_s=10",)
QUICK_STEP = ("step_fixed_s=4",)  # 0.2 s a token: max_tokens 8 takes ~2 s, within the grace


def uvicorn_group(tmp_path: Path):
    """uvicorn with two workers in a process group of its own (as supervisord starts a
    program): the process and its base URL; the group is killed at the end if still running."""
    return uvicorn_started(tmp_path, {}, group=True)


def _in_flight(base: str, key: str, bodies: list[dict]) -> list[object]:
    """POST every body at once from a thread (one connection each); the answers, (status, JSON)
    or the exception, land in the list returned as they come."""
    answers: list[object] = []

    async def post_all() -> None:
        headers = {"Authorization": f"Bearer {key}"}
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def post(body: dict) -> None:
                try:
                    url = f"{base}/v1/chat/completions"
                    async with session.post(url, json=body, headers=headers) as response:
                        answers.append((response.status, await response.json()))
                except (TimeoutError, aiohttp.ClientError) as exc:
                    answers.append(exc)

            await asyncio.gather(*(post(b) for b in bodies))

    threading.Thread(target=asyncio.run, args=(post_all(),), daemon=True).start()
    return answers


def _chat(model: str, max_tokens: int) -> dict:
    return {"model": model, "messages": HELLO, "max_tokens": max_tokens}


def _open_holds(tenant) -> int:
    return Hold.objects.filter(tenant=tenant, state=HoldState.OPEN).count()


def _ledger_checked() -> None:
    call_command("ledger_check", "--grace", "5")  # CommandError when it fails


def test_a_stopped_gateway_releases_the_holds_of_the_requests_it_cuts_off(
    tmp_path: Path, start_sim
) -> None:
    slow = market_create(engine_url=start_sim(settings=SLOW_STEP).url)
    quick = market_create(engine_url=start_sim(settings=QUICK_STEP).url)
    program = program_create("stopped")
    with uvicorn_group(tmp_path) as (proc, base):
        answers = _in_flight(base, program.key, [_chat(slow.served_model, 100)] * SLOW)
        wait_until(lambda: Request.objects.filter(tenant=program.tenant).count() == SLOW)
        quick_answer = _in_flight(base, program.key, [_chat(quick.served_model, 8)])
        wait_until(lambda: Request.objects.filter(tenant=program.tenant).count() == SLOW + 1)
        assert _open_holds(program.tenant) == SLOW + 1
        rows = Request.objects.filter(tenant=program.tenant)
        assert all(len(r.gateway) == 32 for r in rows)  # each knows its gateway process
        stopped_at = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)  # supervisord's stop (stopasgroup)
        proc.wait(timeout=GRACEFUL_SHUTDOWN_S + 8)
        exited_s = time.monotonic() - stopped_at
    # Within supervisord's stopwaitsecs (10 s): the grace, then the releases.
    assert exited_s < 10, exited_s
    # Nothing is left open: not a second later, and no sweep ran.
    assert _open_holds(program.tenant) == 0
    quick_row = Request.objects.get(market=quick)
    assert quick_row.status == RequestStatus.SERVED  # it finished within the grace: charged
    assert quick_answer and quick_answer[0][0] == 200  # type: ignore[index]
    cut = Request.objects.filter(market=slow)
    assert {r.status for r in cut} == {RequestStatus.FAILED}
    assert not LedgerEntry.objects.filter(request__in=cut).exists()
    assert {h.state for h in Hold.objects.filter(request_id__in=cut)} == {HoldState.RELEASED}
    assert BudgetCounter.objects.get(tenant=program.tenant, api_key=None).held == 0
    assert len(answers) == SLOW and all(not isinstance(a, tuple) or a[0] != 200 for a in answers)
    _ledger_checked()


def test_a_killed_gateways_holds_are_released_once_its_heartbeat_is_gone(
    tmp_path: Path, start_sim
) -> None:
    slow = market_create(engine_url=start_sim(settings=SLOW_STEP).url)
    program = program_create("killed")
    with uvicorn_group(tmp_path) as (proc, base):
        _in_flight(base, program.key, [_chat(slow.served_model, 100)] * SLOW)
        wait_until(lambda: _open_holds(program.tenant) == SLOW)
        # A live gateway's requests are not its sweep's.
        assert tasks.gateways_sweep()["failed"] == 0
        os.killpg(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(timeout=10)
    assert tasks.gateways_sweep()["failed"] == 0  # its heartbeat lasts TTL_S yet
    assert _open_holds(program.tenant) == SLOW
    failed = 0
    while _open_holds(program.tenant):  # celery beat's ticks, every SWEEP_S
        assert time.monotonic() - killed_at < gateways.TTL_S + 5, "not released in time"
        failed += tasks.gateways_sweep()["failed"]
        time.sleep(0.25)
    released_s = time.monotonic() - killed_at
    assert gateways.TTL_S - gateways.BEAT_S - 0.5 < released_s  # no sooner than its heartbeat
    assert failed == SLOW
    rows = Request.objects.filter(tenant=program.tenant)
    assert {r.status for r in rows} == {RequestStatus.FAILED}
    assert not LedgerEntry.objects.filter(tenant=program.tenant).exists()
    assert BudgetCounter.objects.get(tenant=program.tenant, api_key=None).held == 0
    _ledger_checked()


@pytest.mark.asyncio
async def test_a_complete_answer_cut_off_while_it_is_settled_is_settled_and_answered(
    acme, market, monkeypatch
) -> None:
    """The server's stop (or a client leaving) cancels a request whose engine has answered and
    whose settlement is under way: the settlement ends, and the view still returns the answer
    it charged (sent if the client is there), instead of a 500 for a charged request."""
    settling = threading.Event()
    settle = services._settlements  # the write of a batch of settlements

    async def slow_settle(served):
        settling.set()
        await asyncio.sleep(0.3)
        return await settle(served)

    monkeypatch.setattr(services, "_settlements", slow_settle)
    body = {"model": market.served_model, "messages": HELLO, "max_tokens": 3}
    params = completion_params(body, endpoint=CHAT, headers={})
    trace = services.Trace(endpoint=CHAT)
    task = asyncio.ensure_future(
        services.completion_create(params=params, key=acme.key, trace=trace)
    )
    while not settling.is_set():
        await asyncio.sleep(0.01)
    task.cancel()  # as uvicorn's graceful shutdown does, past its timeout
    answer = await task
    rid = request_id_of(answer["id"])
    row = await gateway_db.db_call(request_row, request_id=rid)  # the gateway's threads
    assert row.status == RequestStatus.SERVED
    charged = await gateway_db.db_call(entries, request_id=rid)
    assert sorted(e.kind for e in charged) == ["priority", "tokens"]
    assert answer["usage"]["completion_tokens"] == 3
    await asyncio.to_thread(gateway_db.connections_close)  # before the test database goes


def test_only_a_known_gateway_whose_heartbeat_is_gone_is_swept(acme) -> None:
    """An instance Redis does not know (its data lost, or never reached) is left to the stale
    sweep; one that beat and whose heartbeat expired is swept once, then forgotten."""
    from accounts.services import request_open

    market = market_create(engine_url=f"http://127.0.0.1:{dead_port()}")
    unknown, lost = "0" * 32, "1" * 32
    client = gateways.redis_client(settings.REDIS_URL)
    gateways.beat(lost)
    client.delete(gateways.ALIVE_KEY + lost)  # as its TTL would, once it stopped beating
    for i, instance in enumerate((unknown, lost)):
        request_open(
            request_id=f"gw-stop-{i}", tenant=acme.tenant, api_key=acme.api_key, market=market,
            bid="0", hold_amount="0.01", gateway=instance,
        )  # fmt: skip
    assert tasks.gateways_sweep()["failed"] == 0  # missing: the first look
    time.sleep(gateways.CONFIRM_S)
    assert tasks.gateways_sweep()["failed"] == 1  # still missing: lost
    assert Request.objects.get(gateway=lost).status == RequestStatus.FAILED
    assert Request.objects.get(gateway=unknown).status == RequestStatus.QUEUED
    assert not client.sismember(gateways.INSTANCES_KEY, lost)  # forgotten
    assert not client.hexists(gateways.MISSING_KEY, lost)
    assert tasks.gateways_sweep()["failed"] == 0


def test_gateways_whose_heartbeats_expired_while_redis_was_away_are_not_swept(acme) -> None:
    """Redis unreachable for longer than a heartbeat lasts (the soak's 30 s outage): every live
    gateway's key expires meanwhile, and the first sweep after Redis is back finds them all
    missing. They beat again within BEAT_S of its return, so the second look finds them alive
    and none of their requests in flight is failed. Before: the first sweep failed them all."""
    from accounts.services import request_open

    market = market_create(engine_url=f"http://127.0.0.1:{dead_port()}")
    live = ["2" * 32, "3" * 32]
    client = gateways.redis_client(settings.REDIS_URL)
    for i, instance in enumerate(live):
        gateways.beat(instance)
        client.delete(gateways.ALIVE_KEY + instance)  # expired while Redis was away
        request_open(
            request_id=f"gw-outage-{i}", tenant=acme.tenant, api_key=acme.api_key, market=market,
            bid="0", hold_amount="0.01", gateway=instance,
        )  # fmt: skip
    assert tasks.gateways_sweep()["failed"] == 0  # Redis is back: all missing, a first look
    time.sleep(gateways.BEAT_S)
    for instance in live:
        gateways.beat(instance)  # their heartbeat threads reach Redis again
    time.sleep(gateways.CONFIRM_S - gateways.BEAT_S)
    assert tasks.gateways_sweep()["failed"] == 0
    assert {r.status for r in Request.objects.filter(gateway__in=live)} == {RequestStatus.QUEUED}
    assert not any(client.hexists(gateways.MISSING_KEY, instance) for instance in live)
