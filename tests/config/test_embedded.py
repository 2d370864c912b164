"""The embedded mode: no Redis, the in-memory channel layer, and the publishers inside the web
server's process sending through the loop that serves the websockets (config.embedded)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from config.embedded import live_services_start
from market.templatetags.units import rate
from tests.market.live_helpers import record, subtree
from tests.personas import logged_in, world_create


@pytest.mark.django_db(transaction=True)
def test_records_appended_to_the_jsonl_file_reach_a_browser_socket(
    asgi_server, settings, tmp_path, client, unique_slug
) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    world = world_create(market_slug=unique_slug)
    logged_in(client, world, "operator")
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    jsonl = tmp_path / "rounds.jsonl"
    services = live_services_start(loop=asgi_server.loop, rounds_jsonl=jsonl, periodic=False)

    async def watch() -> dict[str, dict]:
        url = f"ws://127.0.0.1:{asgi_server.port}/ws/markets/{unique_slug}/"
        headers = {"Cookie": cookie, "Origin": asgi_server.url}
        seen: dict[str, dict] = {}
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(url, headers=headers) as ws:
                line = json.dumps(record(unique_slug, 1, subtrees=[subtree("k", requests=3)]))
                jsonl.write_text(line + "\n")  # what the engine's --rounds-jsonl does
                while not {"book.diff", "round.result"} <= set(seen):
                    message = await asyncio.wait_for(ws.receive_json(), timeout=10)
                    seen[message["kind"]] = message
        return seen

    try:
        seen = asyncio.run(watch())
    finally:
        services.stop()
    assert [r["key"] for r in seen["book.diff"]["changed"]] == ["k"]
    assert seen["round.result"]["rounds"] == 1


def test_amounts_are_shown_short_and_exact() -> None:
    from decimal import Decimal

    assert rate(Decimal("0.002000000")) == "0.002"
    assert rate(Decimal("0E-9")) == "0"
    assert rate(Decimal("10.000000000")) == "10"


def _default_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_live_serve_serves_and_stops_on_ctrl_c(tmp_path) -> None:
    """``manage.py live_serve``: Daphne and the live publishers in one process."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    import httpx
    from django.db import connection

    from tests.conftest import REPO_ROOT, dead_port

    db = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env["DATABASE_URL"] = (
        f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"  # the test database
    )
    port = dead_port()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "live_serve", "--port", str(port),
         "--rounds-jsonl", str(tmp_path / "rounds.jsonl")],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # As a terminal starts it: a suite run in the background (``make test &``) has SIGINT
        # ignored, the child would inherit that, and Twisted then leaves Ctrl-C ignored.
        preexec_fn=_default_sigint,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/console/", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "live_serve did not listen"
                time.sleep(0.2)
        assert response.status_code == 302  # to the login page
        # A 60 kB header line is answered (431), not dropped without a word.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + b"k" * 60_000
                + b"\r\n\r\n"
            )
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert json.loads(body)["error"]["code"] == "request_header_too_large"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()  # the test fails, but leaves no server behind
            process.communicate()
            raise
    assert f"Serving on http://127.0.0.1:{port}/ (live)" in output
    assert "live: publishing round records from" in output
