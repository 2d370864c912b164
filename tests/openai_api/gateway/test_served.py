"""The money rules under the production server (issue 16): uvicorn with two worker processes,
started by ``config.serving`` exactly as ``make run`` and the production recipe
(docs/operations.md) start it, on the test's PostgreSQL database, in front of a simulated engine.

Two processes admit and settle at once here, each with its own database threads and caches
(both caches off, so a change is seen at once): what keeps a budget from being overspent and a
charge from being written twice must be in the database, not in one process's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import aiohttp
import httpx
import psutil
import pytest
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
from accounts.money import money_str
from config.serving import server_argv
from market.live.send import group_send_many
from market.payloads import market_group
from tests.conftest import REPO_ROOT, dead_port
from tests.openai_api.conftest import market_create
from tests.openai_api.helpers import HELLO, token_charge_by_hand, wait_until
from tests.personas import logged_in, program_create, world_create

pytestmark = [pytest.mark.django_db(transaction=True)]
WORKERS = 2


def _database_url() -> str:
    db = connection.settings_dict
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{db['USER']}{password}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"


def _workers(pid: int) -> list[psutil.Process]:
    return [
        p for p in psutil.Process(pid).children()
        if "resource_tracker" not in " ".join(p.cmdline())
    ]  # fmt: skip


@contextlib.contextmanager
def uvicorn_started(
    tmp_path: Path, env: dict[str, str], *, group: bool = False
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """uvicorn with two workers on the test database (``env`` added to its environment; a
    ``DATABASE_URL`` there wins), once it answers and both workers serve: the process and its
    base URL. ``group``: in a process group of its own (as supervisord starts a program),
    SIGKILLed whole at the end if still running; else terminated."""
    port = dead_port()
    environ = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "DEBUG": "0",
        # The test's own key: a session logged in here is valid there (its auth hash).
        "SECRET_KEY": settings.SECRET_KEY,
        "ALLOWED_HOSTS": "127.0.0.1",
        "GATEWAY_API_KEY_CACHE_S": "0",
        "GATEWAY_MARKET_CACHE_S": "0",
        **env,
    }
    argv = server_argv("uvicorn", host="127.0.0.1", port=port, workers=WORKERS)
    log_path = tmp_path / "uvicorn.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        argv, cwd=REPO_ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=group,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "uvicorn did not answer in 60 s"
            time.sleep(0.2)
        # Both workers serve: the supervisor has two worker processes (and may have a
        # multiprocessing resource tracker).
        wait_until(lambda: len(_workers(proc.pid)) == WORKERS)
        yield proc, base
    finally:
        if group:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        else:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


@contextlib.contextmanager
def uvicorn_served(tmp_path: Path, **env: str) -> Iterator[str]:
    """:func:`uvicorn_started` with the gateway's metrics on: its base URL."""
    (tmp_path / "prometheus").mkdir()
    metrics = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus")}
    with uvicorn_started(tmp_path, {**metrics, "METRICS_TOKEN": "served-metrics", **env}) as (
        _,
        base,
    ):
        yield base


@pytest.fixture
def served(transactional_db, tmp_path: Path) -> Iterator[str]:
    """uvicorn with two workers on the test database: its base URL."""
    with uvicorn_served(tmp_path) as base:
        yield base


def _chat(max_tokens: int, **extra) -> dict:
    return {"model": "", "messages": HELLO, "max_tokens": max_tokens, **extra}


async def _post_all(base: str, key: str, bodies: list[dict]) -> list[tuple[int, dict]]:
    """POST every body at once (one connection each), each answer as (status, JSON)."""
    headers = {"Authorization": f"Bearer {key}"}
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def post(body: dict) -> tuple[int, dict]:
            async with session.post(
                f"{base}/v1/chat/completions", json=body, headers=headers
            ) as response:
                return response.status, await response.json()

        return await asyncio.gather(*(post(b) for b in bodies))


def test_concurrent_requests_at_the_edge_of_a_budget_are_never_overspent(served, sim) -> None:
    """40 requests at once, spread over the two workers, against a budget that fits about 6 of
    their worst cases: HELLO is 16 prompt tokens (x $3/M) and max_tokens 100 (x $15/M), a hold
    of $0.001548 each, $0.0619 for all 40 against $0.01. Each served request is charged once,
    exactly its tokens; the refused are 429 insufficient_quota and leave nothing; spent <= the
    limit."""
    market = market_create(engine_url=sim.url)
    program = program_create("edge", budget="0.01")
    bodies = [_chat(100, model=market.served_model) for _ in range(40)]
    answers = asyncio.run(_post_all(served, program.key, bodies))
    statuses = sorted({status for status, _ in answers})
    assert set(statuses) <= {200, 429}, answers
    served_ids = [body["id"].removeprefix("chatcmpl-") for status, body in answers if status == 200]
    refused = [body for status, body in answers if status == 429]
    assert served_ids and refused  # both sides of the edge were reached
    assert {b["error"]["code"] for b in refused} == {"insufficient_quota"}
    # By hand: every served request's token entry is its usage at the posted prices, once.
    tokens = {r: list(LedgerEntry.objects.filter(request_id=r, kind=ChargeKind.TOKENS))
              for r in served_ids}  # fmt: skip
    for body, rid in zip([b for s, b in answers if s == 200], served_ids, strict=True):
        usage = body["usage"]
        assert len(tokens[rid]) == 1
        assert tokens[rid][0].amount == token_charge_by_hand(
            prompt=usage["prompt_tokens"],
            cached=(usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            completion=usage["completion_tokens"],
        )
    spent = sum(e.amount for e in LedgerEntry.objects.filter(tenant=program.tenant))
    assert spent <= Decimal("0.01")
    # Two entries a served request, settled together: its tokens and its priority (0: no bid).
    assert LedgerEntry.objects.filter(tenant=program.tenant).count() == 2 * len(served_ids)
    priority = LedgerEntry.objects.filter(tenant=program.tenant, kind=ChargeKind.PRIORITY)
    assert set(priority.values_list("amount", flat=True)) == {Decimal(0)}
    # Nothing is left held, and the tenant's counter agrees with the ledger.
    assert not Hold.objects.filter(tenant=program.tenant, state=HoldState.OPEN).exists()
    counter = BudgetCounter.objects.get(tenant=program.tenant, api_key=None)
    assert counter.held == 0
    assert counter.month_spent == spent
    assert Request.objects.filter(tenant=program.tenant).count() == len(served_ids)


def test_a_dead_engine_is_a_503_and_charges_nothing(served) -> None:
    market = market_create(engine_url=f"http://127.0.0.1:{dead_port()}")
    program = program_create("dead")
    answers = asyncio.run(
        _post_all(served, program.key, [_chat(5, model=market.served_model) for _ in range(6)])
    )
    assert {status for status, _ in answers} == {503}
    assert {body["error"]["code"] for _, body in answers} == {"engine_unavailable"}
    assert not LedgerEntry.objects.filter(tenant=program.tenant).exists()
    rows = list(Request.objects.filter(tenant=program.tenant))
    assert len(rows) == 6 and {r.status for r in rows} == {RequestStatus.FAILED}
    assert {h.state for h in Hold.objects.filter(tenant=program.tenant)} == {HoldState.RELEASED}
    assert BudgetCounter.objects.get(tenant=program.tenant, api_key=None).held == 0


def test_a_streamed_completion_is_charged_once_its_tokens(served, sim) -> None:
    market = market_create(engine_url=sim.url)
    program = program_create("stream")
    body = _chat(7, model=market.served_model, stream=True,
                 stream_options={"include_usage": True})  # fmt: skip
    events = []
    with httpx.stream(
        "POST", f"{served}/v1/chat/completions", json=body,
        headers={"Authorization": f"Bearer {program.key}"}, timeout=30,
    ) as response:  # fmt: skip
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage = chunks[-1]["usage"]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert usage["completion_tokens"] == 7 and text
    rid = chunks[0]["id"].removeprefix("chatcmpl-")
    entry, priority = (
        LedgerEntry.objects.get(request_id=rid, kind=kind)
        for kind in (ChargeKind.TOKENS, ChargeKind.PRIORITY)
    )
    assert priority.amount == 0  # no bid; settled with the tokens
    assert entry.amount == token_charge_by_hand(
        prompt=usage["prompt_tokens"],
        cached=(usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        completion=7,
    )
    assert chunks[-1]["auction"]["token_charge"] == money_str(entry.amount)


def test_metrics_sum_every_worker(served, sim) -> None:
    """With PROMETHEUS_MULTIPROC_DIR, /metrics counts the answers of both workers, whichever
    one answers the scrape."""
    market = market_create(engine_url=sim.url)
    program = program_create("metrics")
    answers = asyncio.run(
        _post_all(served, program.key, [_chat(2, model=market.served_model) for _ in range(30)])
    )
    assert {status for status, _ in answers} == {200}
    for _ in range(4):  # whichever worker answers
        text = httpx.get(
            f"{served}/metrics", headers={"Authorization": "Bearer served-metrics"}
        ).text
        line = next(
            ln for ln in text.splitlines()
            if ln.startswith("gateway_requests_total{") and f'market="{market.slug}"' in ln
        )  # fmt: skip
        assert float(line.rsplit(" ", 1)[1]) == 30


def test_websockets_are_served_by_the_workers_and_reach_the_browser(served, client) -> None:
    """/ws/ under uvicorn: an operator's socket is accepted by one worker and gets a message
    sent through the Redis channel layer from another process (this one)."""
    world = world_create(market_slug="served-ws")
    logged_in(client, world, "operator")
    headers = {"Cookie": f"sessionid={client.cookies['sessionid'].value}", "Origin": served}
    url = served.replace("http://", "ws://") + "/ws/markets/served-ws/"
    status = {
        "kind": "engine.status", "market": "served-ws", "at": 1.0, "up": True, "error": "",
        "queue": 7, "running": 1, "cache_hit_rate": None, "tokens_per_second": None,
        "prompt_tokens_per_second": None, "ttft_p50_s": None, "ttft_p99_s": None,
        "window_s": None,
    }  # fmt: skip

    async def watch() -> tuple[dict, int]:
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(url, headers={"Origin": served}):
                    refused = 101
            except aiohttp.WSServerHandshakeError as exc:
                refused = exc.status  # the consumer closed before accepting: refused
            async with session.ws_connect(url, headers=headers) as ws:
                await asyncio.sleep(0.3)  # the consumer has joined its groups once accepted
                await asyncio.to_thread(group_send_many, [(market_group("served-ws"), status)])
                while True:
                    message = await asyncio.wait_for(ws.receive_json(), timeout=10)
                    if message.get("kind") == "engine.status":
                        return message, refused

    message, refused_status = asyncio.run(watch())
    assert message["queue"] == 7
    assert refused_status == 403  # an anonymous socket is refused


def test_the_served_command_is_the_one_config_serving_gives() -> None:
    argv = server_argv("uvicorn", host="127.0.0.1", port=8000, workers=4)
    assert argv[:3] == [sys.executable, "-m", "uvicorn"]
    assert ["--workers", "4"] == argv[argv.index("--workers") : argv.index("--workers") + 2]
    assert "uvloop" in argv and "httptools" in argv
    with pytest.raises(ValueError, match="one process"):
        server_argv("daphne", host="127.0.0.1", port=8000, workers=2)
