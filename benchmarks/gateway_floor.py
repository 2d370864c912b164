"""The floor under the gateway's added latency on this machine: an ASGI app that forwards each
``POST /v1/completions`` to the engine's ``/generate`` (one pooled aiohttp session) and does
nothing else, served by uvicorn like the gateway (``config.serving``), one process.

With ``GATEWAY_FLOOR_COMMITS=N`` it also commits N one-row inserts on PostgreSQL per request,
through one async psycopg connection on the event loop (no thread, no ORM): half before
forwarding, half after, where the gateway holds and then charges. What the gateway adds beyond
``floor:2`` is its own work (authentication, admission, the ledger's statements, Django); what
``floor:2`` adds beyond the engine is the machine's (an HTTP hop, two database round trips).

``benchmarks.gateway --servers floor:0,floor:2,...`` runs it; nothing else does.
"""

from __future__ import annotations

import os
import uuid

import aiohttp
import psycopg

TABLE = "benchmark_gateway_floor"  # created and dropped by benchmarks.gateway
COMMITS = int(os.environ.get("GATEWAY_FLOOR_COMMITS", "0"))
_state: dict[str, object] = {}


async def _connected() -> tuple[aiohttp.ClientSession, psycopg.AsyncConnection | None]:
    if "session" not in _state:
        _state["session"] = aiohttp.ClientSession()
        _state["db"] = (
            await psycopg.AsyncConnection.connect(os.environ["GATEWAY_FLOOR_DSN"], autocommit=True)
            if COMMITS
            else None
        )
    return _state["session"], _state["db"]  # type: ignore[return-value]


async def _commit(db: psycopg.AsyncConnection, n: int) -> None:
    for _ in range(n):
        await db.execute(f"INSERT INTO {TABLE} DEFAULT VALUES")


async def app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] != "/v1/completions":  # readiness checks
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
        return
    session, db = await _connected()
    if db is not None:
        await _commit(db, COMMITS // 2)
    body = {
        "rid": "floor-" + uuid.uuid4().hex,
        "text": "Hi there",
        "sampling_params": {"max_new_tokens": 1, "custom_params": {"bid": 0.001}},
    }
    async with session.post(os.environ["GATEWAY_FLOOR_ENGINE"] + "/generate", json=body) as r:
        answer = await r.read()
        status = r.status
    if db is not None:
        await _commit(db, COMMITS - COMMITS // 2)
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": answer})
