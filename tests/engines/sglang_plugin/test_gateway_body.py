"""The body SGLang 0.5.23 gets through SGLang's model gateway (smg 1.13.0, the real binary):
smg rebuilds the engine client's ``/generate`` body from its own typed request (adding
``"model": "unknown"`` and its defaults), and SGLang must still take it, with the bid and the
tenant's tag where the plugin reads them. The worker behind the gateway here records what it
gets; SGLang's own parsing then reads it as its HTTP server does: the JSON contract gate
(``generate_contract_error``), the ``GenerateReqInput`` dataclass (through pydantic, as
FastAPI builds it), the tokenizer manager's ``SamplingParams(**sampling_params)`` and its
checks, and a scheduler ``Req``. What a GPU run checks against a live server
(``scripts/gpu_bench.sh``), checked here on the CPU."""

from __future__ import annotations

import asyncio
import threading
from array import array
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from aiohttp import web
from pydantic import TypeAdapter
from sglang.srt.entrypoints.api_contract import generate_contract_error
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_params import SamplingParams

from engines.client import EngineClient, generate_body
from engines.contract.wire import AuctionParams
from engines.router import Router, RouterOptions
from engines.sglang_plugin.market_queue import auction_of
from tests.conftest import dead_port

VOCAB = 32_000


class RecordingWorker:
    """An HTTP worker that answers smg's probes as SGLang does and records each ``/generate``
    body it gets (answering with one token, streamed or not). Runs in a thread."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        meta = {"id": body.get("rid"), "prompt_tokens": 2, "completion_tokens": 1,
                "cached_tokens": 0, "finish_reason": {"type": "length", "length": 1}}  # fmt: skip
        answer = {"text": "x", "meta_info": meta}
        if not body.get("stream"):
            return web.json_response(answer)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: " + web.json_response(answer).body + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _info(self, request: web.Request) -> web.Response:
        info = {"model_path": "m", "served_model_name": "m", "tp_size": 1, "dp_size": 1}
        return web.json_response({**info, "version": "0.5.23", "is_generation": True})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _listen(self) -> int:
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/server_info", self._info)
        app.router.add_get("/model_info", self._info)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return self._runner.addresses[0][1]

    def __enter__(self) -> RecordingWorker:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


@contextmanager
def gateway_in_front() -> Iterator[tuple[RecordingWorker, Router]]:
    with RecordingWorker() as worker:
        options = RouterOptions(port=dead_port(), worker_urls=(worker.url,))
        with Router(options) as front:
            yield worker, front


@pytest.mark.parametrize("stream", [False, True])
def test_sglang_takes_the_body_smg_rebuilds_and_the_plugin_reads_its_bid(stream) -> None:
    sent = generate_body(
        rid="gw-1", max_new_tokens=8, bid=0.375, text="Hello there", owner="acme_2",
        sampling_params={"temperature": 0.5, "top_p": 0.9, "stop": ["\n\n"]}, stream=stream,
    )  # fmt: skip

    async def send(url: str) -> None:
        client = EngineClient()
        try:
            if stream:
                assert [c async for c in client.generate_stream(base_url=url, body=sent)]
            else:
                await client.generate(base_url=url, body=sent)
        finally:
            await client.aclose()

    with gateway_in_front() as (worker, front):
        asyncio.run(send(front.url))
    (got,) = worker.bodies
    assert got != sent  # rebuilt: smg's own fields added
    assert got["rid"] == "gw-1" and got["stream"] is stream
    # SGLang's HTTP server: the JSON contract, then the request dataclass as FastAPI makes it.
    assert generate_contract_error(got) is None
    request = TypeAdapter(GenerateReqInput).validate_python(got)
    request.normalize_batch_and_arguments()
    # The tokenizer manager: the sampling parameters, checked; then the scheduler's request.
    params = SamplingParams(**request.sampling_params)
    params.verify(VOCAB)
    req = Req(rid=request.rid, origin_input_text=request.text,
              origin_input_ids=array("q", [1, 2]), sampling_params=params)  # fmt: skip
    assert auction_of(req) == AuctionParams(0.375, "acme_2")
    assert (params.max_new_tokens, params.temperature, params.stop_strs) == (8, 0.5, ["\n\n"])
