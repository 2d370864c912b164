"""Hand-made round records for the live-console tests (the personas: ``tests.personas``), and
the live publishers as Celery runs them (``LivePublishers``).

Every number here is written out by hand; expectations in the tests are worked out by hand too.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from django.db import close_old_connections, connections
from django.test import Client

from engines.contract.records import SCHEMA
from market.live.periodic import live_tick
from tests.conftest import REPO_ROOT
from tests.scheduler_bridge.workers import worker_database_url

logger = logging.getLogger(__name__)


def subtree(
    key: str,
    *,
    label: str = "<|system|> You are",
    depth: int = 1,
    requests: int = 2,
    bid_sum: float = 0.5,
    position: int = 0,
    rank: int = 0,
    credit_sum: float | None = None,
) -> dict[str, Any]:
    """One SubtreeSummary; bid_mean and density follow from the arguments (100 tokens of work);
    ``credit_sum``: the age credits it reports ($/s; None: the field left out)."""
    credits = {} if credit_sum is None else {"credit_sum": credit_sum}
    return {
        **credits,
        "key": key,
        "label": label,
        "depth": depth,
        "prefix_tokens": 40,
        "cached_tokens": 30,
        "requests": requests,
        "bid_sum": bid_sum,
        "bid_mean": bid_sum / requests,
        "density": (bid_sum + (credit_sum or 0.0)) / 100,
        "rank": rank,
        "first_position": position,
    }


def admitted(request_id: str, *, charge: float = 0.002, bid: float = 0.5) -> dict[str, Any]:
    """One admitted request that waited in a 3-request subtree averaging 0.25 $/s."""
    return {
        "request_id": request_id,
        "bid": bid,
        "effective_bid": bid,
        "position": 1,
        "planned_completion_s": 0.25,
        "time_saved_s": 0.125,
        "charge": charge,
        "prompt_tokens": 1200,
        "cached_tokens": 1000,
        "block": {"prefix_tokens": 40, "requests": 3, "bid_mean": 0.25, "density": 0.0075},
    }


def record(
    market: str,
    seq: int,
    *,
    subtrees: list[dict[str, Any]] | None = None,
    admitted_requests: list[dict[str, Any]] | None = None,
    waiting: int = 10,
    reserve: float = 0.0,
    engine: str = "sim@test",
) -> dict[str, Any]:
    """A valid round record of ``market`` (engines.contract.records)."""
    return {
        "schema": SCHEMA,
        "engine": engine,
        "market": market,
        "epoch": "epoch1",
        "round_id": f"{engine}:epoch1:{seq}",
        "seq": seq,
        "time": 1_800_000_000.0 + seq,
        "policy": "dfs-auction-density",
        "reserve": reserve,
        "tokens_per_second": 10_000.0,
        "waiting": waiting,
        "subtrees": subtrees or [],
        "admitted": admitted_requests or [],
    }


def session_cookie(client: Client) -> list[tuple[bytes, bytes]]:
    """The headers a browser with ``client``'s session sends on a websocket handshake."""
    headers = [(b"origin", b"http://localhost")]
    sid = client.cookies.get("sessionid")
    if sid is not None:
        headers.append((b"cookie", f"sessionid={sid.value}".encode()))
    return headers


class LivePublishers:
    """What Celery runs in production, against the test database: ``manage.py rounds_consume``
    on the engines' stream (a process), and the periodic tick every second (a thread)."""

    def __init__(self, stream: str, log: Path) -> None:
        env = os.environ.copy() | {"DATABASE_URL": worker_database_url()}
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "rounds_consume", "--stream", stream],
                cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="live-tick", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            try:
                close_old_connections()
                live_tick()
            except Exception:
                logger.exception("live: periodic tick failed")
        connections.close_all()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
