"""An engine that admits a request, records the round, and dies before it answers.

Issue 12: the gateway answered 503 "not charged" while the round record of the round that
admitted the request still charged its priority. The engine here is a real TCP server that
reads the request, writes the round record it would have sent (its own charge for the request
in it), then drops the connection: the gateway answers 503 and nothing is charged, since a
priority charge reaches the ledger only with the settlement of a served request (round records
move no money), and a failed request is never settled.
"""

from __future__ import annotations

import asyncio
import json
import threading
from decimal import Decimal

import openai
import pytest

from accounts.models import Hold, HoldState, LedgerEntry, Request, RequestStatus
from accounts.services import request_settle
from tests.accounts.factories import admitted, priority_charge, round_record
from tests.openai_api.conftest import market_create
from tests.openai_api.helpers import HELLO

pytestmark = pytest.mark.django_db(transaction=True)


class DyingEngine:
    """Reads each /generate, writes a round record admitting its rid, then resets the
    connection (an engine process killed mid-request)."""

    def __init__(self, market: str) -> None:
        self.market = market
        self.records: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> DyingEngine:
        self._thread.start()
        start = asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(timeout=5)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(
            (int(v) for k, _, v in (h.partition(":") for h in lines[1:])
             if k.strip().lower() == "content-length"),
            0,
        )  # fmt: skip
        body = json.loads(await reader.readexactly(length)) if length else {}
        if lines[0].startswith("POST /generate"):
            seq = len(self.records) + 1
            record = round_record(f"dying:1:{seq}", [admitted(body["rid"], 0.125)],
                                  market=self.market, seq=seq)  # fmt: skip
            self.records.append(record)
        writer.transport.abort()


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_whose_engine_dies_after_admitting_it_is_never_charged(
    gateway, acme, stream
) -> None:
    market = market_create(engine_url="http://127.0.0.1:9")
    with DyingEngine(market.slug) as engine:
        market.engine_url = engine.url
        market.save()
        with pytest.raises(openai.InternalServerError) as caught:
            acme.client(gateway).chat.completions.create(
                model=market.served_model, messages=HELLO, stream=stream,
                extra_body={"bid": "0.2"},
            )  # fmt: skip
    assert caught.value.status_code == 503
    assert "not charged" in caught.value.body["message"]
    (request,) = Request.objects.all()
    assert request.status == RequestStatus.FAILED
    # The engine admitted it (its round record says so, with a charge), then died: the request
    # failed, and a settlement that comes late anyway (an answer after all) charges nothing.
    (record,) = engine.records
    assert record["admitted"][0]["request_id"] == request.request_id
    for _ in range(2):
        with pytest.raises(ValueError, match="not charged"):
            request_settle(request_id=request.request_id, prompt_tokens=1, cached_tokens=0,
                           completion_tokens=1, priority=priority_charge(0.125))  # fmt: skip
    assert not LedgerEntry.objects.exists()
    hold = Hold.objects.get(request_id=request.request_id)
    assert (hold.state, hold.remaining) == (HoldState.RELEASED, Decimal(0))
