"""What the site's log gets for ordinary events (issue 48, item 7): a 403 is one line, the
access decision, with no traceback; a client that leaves, or a server stop that cuts a page's
request off, logs nothing ("Task exception was never retrieved" with RequestAborted was)."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest
from django.core.handlers.asgi import ASGIHandler

from tests.personas import logged_in, world_create


def _tracebacks(caplog) -> list[str]:
    formatter = logging.Formatter()
    return [formatter.format(r) for r in caplog.records if "Traceback" in formatter.format(r)]


@pytest.mark.django_db
def test_a_403_logs_one_line_without_a_traceback(client, caplog) -> None:
    world = world_create()
    caplog.set_level(logging.WARNING)
    logged_in(client, world, "a_viewer")
    assert client.get("/console/").status_code == 403
    assert client.post("/tenants/acme/keys/", {"name": "k"}).status_code == 403
    lines = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        (
            "django.request",
            "WARNING",
            "Forbidden (Permission denied): /console/ (The console is for operators.)",
        ),
        (
            "django.request",
            "WARNING",
            "Forbidden (Permission denied): /tenants/acme/keys/ "
            "(Only the tenant's admins manage its API keys.)",
        ),
    ]
    assert all(r.exc_info is None for r in caplog.records)
    assert _tracebacks(caplog) == []


def test_a_5xx_keeps_its_traceback() -> None:
    from config.logs import ClientErrorOneLine

    try:
        raise RuntimeError("a bug")
    except RuntimeError as exc:
        record = logging.LogRecord(
            "django.request", logging.ERROR, __file__, 1, "Internal Server Error: %s",
            ("/x/",), (RuntimeError, exc, exc.__traceback__),
        )  # fmt: skip
    record.status_code = 500
    assert ClientErrorOneLine().filter(record)
    assert record.exc_info is not None and record.getMessage() == "Internal Server Error: /x/"


def _scope(path: str) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }  # fmt: skip


async def _served(path: str, *, cancelled: bool) -> None:
    """``path`` through the site's ASGI app as a server drives it: the client leaves while the
    page is being made; ``cancelled``: the server cancels the app's task first (uvicorn at its
    stop, past its graceful timeout), then the connection closes."""
    from config.asgi import http_app

    left = asyncio.Event()
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        pass

    task = asyncio.create_task(http_app(_scope(path), receive, send))
    await asyncio.sleep(0.05)  # the page is being made
    if cancelled:
        task.cancel()
        await asyncio.wait([task], timeout=5)
    left.set()
    await asyncio.wait([task], timeout=5)
    await asyncio.sleep(0.5)  # the page's request ends
    del task
    gc.collect()  # an unretrieved exception is logged when its task is collected
    await asyncio.sleep(0)


@pytest.mark.parametrize("cancelled", [False, True], ids=["client leaves", "server stops"])
def test_a_request_cut_off_logs_no_unretrieved_task_exception(caplog, monkeypatch, cancelled):
    slow_page = ASGIHandler.run_get_response

    async def slowly(self, request):
        await asyncio.sleep(0.2)
        return await slow_page(self, request)

    monkeypatch.setattr(ASGIHandler, "run_get_response", slowly)
    caplog.set_level(logging.WARNING, logger="asyncio")
    asyncio.run(_served("/console/", cancelled=cancelled))
    gc.collect()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    assert _tracebacks(caplog) == []
