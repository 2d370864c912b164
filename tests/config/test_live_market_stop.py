"""``manage.py live_market`` stopped with SIGTERM under load leaves no hold open (issue 45,
item 3): supervisord stops the agents, then the web server (uvicorn lets the requests in flight
finish for a few seconds, then the gateway releases the holds of those it cuts off), the engines
last. ``manage.py ledger_check --grace 5`` passes right after the stop, without waiting for any
sweep (the Celery worker is stopped too). Before, tens of holds stayed open for 20 minutes.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.config import test_live_market as live
from tests.config.test_live_market import MANAGE, MODEL, LiveMarket, _sql

# live_market's fixtures: a seeded template database (per module), a copy of it per test.
seeded = live.seeded
database = live.database

CLIENTS = 24  # the load's own clients, each one request after the other, besides the agents
OPEN_HOLDS = "SELECT count(*) FROM accounts_hold WHERE state = 'open'"


def _chat(base: str, key: str, i: int) -> int:
    """One chat completion of 256 tokens at most through the gateway: its status."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"topic {i % 5}: " + "tell me more " * (i % 4)}],
        "max_tokens": 256,
        "bid": 0.01 * (i % 3),
    }
    request = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.timeout(150)
def test_a_live_market_stopped_under_load_leaves_no_hold_open(tmp_path, database, seeded):
    market = LiveMarket(tmp_path, database)
    stopping = threading.Event()
    answers: list[int] = []

    def client(i: int) -> None:
        while not stopping.is_set():
            try:
                answers.append(_chat(market.base, seeded[1], i))
            except OSError:
                answers.append(0)  # refused or cut: the server is stopping
                time.sleep(0.05)

    try:
        market.up()
        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while answers.count(200) < 20:  # the load is served, and requests are in flight
            assert time.monotonic() < deadline, f"too few answers: {answers[-20:]}"
            time.sleep(0.2)
        # Requests in flight, each with its hold, when the stop begins.
        held = _sql(OPEN_HOLDS, database=database)
        stopped_at = time.monotonic()
    finally:
        market.stop()
        stopping.set()
    stop_s = time.monotonic() - stopped_at
    assert held[0][0] > 0  # the stop did cut requests off
    assert "killing 'web'" not in market.output  # stopped within stopwaitsecs, not killed
    open_after = _sql(OPEN_HOLDS, database=database)
    check = subprocess.run(
        [*MANAGE, "ledger_check", "--grace", "5"], env=market.env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert (open_after[0][0], check.returncode) == (0, 0), (stop_s, check.stdout, check.stderr)
