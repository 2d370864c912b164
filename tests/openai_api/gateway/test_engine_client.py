"""The engine client against the simulated engine, a closed port, and an SGLang-shaped server
that sends none of the auction's fields."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from engines.client import (
    EngineClient,
    EngineOverloaded,
    EngineRejected,
    EngineUnavailable,
    generate_body,
)
from tests.conftest import dead_port

pytestmark = pytest.mark.asyncio


def body(rid: str, *, max_new_tokens: int = 3, bid: float = 0.0, text: str = "Hello") -> dict:
    return generate_body(rid=rid, max_new_tokens=max_new_tokens, bid=bid, text=text)


async def test_generate_body_is_sglangs_native_request():
    assert generate_body(
        rid="r1", max_new_tokens=7, bid=0.25, input_ids=[1, 2], sampling_params={"top_p": 0.9}
    ) == {
        "rid": "r1",  # the request's id, as it is
        "input_ids": [1, 2],
        "stream": False,
        # The bid is a field of SGLang's custom_params, the tenant's tag beside it when given.
        "sampling_params": {"top_p": 0.9, "max_new_tokens": 7, "custom_params": {"bid": 0.25}},
    }
    assert generate_body(rid="r2", max_new_tokens=1, bid=0, text="a", owner="17")[
        "sampling_params"
    ] == {"max_new_tokens": 1, "custom_params": {"bid": 0.0, "tenant": "17"}}
    # The market's fields replace whatever custom_params a caller passed along.
    assert generate_body(
        rid="r3", max_new_tokens=1, bid=0.5, text="a", sampling_params={"custom_params": {"x": 1}}
    )["sampling_params"]["custom_params"] == {"bid": 0.5}
    with pytest.raises(ValueError):
        generate_body(rid="r", max_new_tokens=1, bid=0, text="a", input_ids=[1])
    with pytest.raises(ValueError):
        generate_body(rid="", max_new_tokens=1, bid=0, text="a")
    with pytest.raises(ValueError):
        generate_body(rid="r", max_new_tokens=1, bid=-0.5, text="a")
    with pytest.raises(ValueError):
        generate_body(rid="r", max_new_tokens=1, bid=0, text="a", owner="a b")


async def test_generate_against_the_simulated_engine(sim):
    client = EngineClient()
    output = await client.generate(base_url=sim.url, body=body("c1", bid=0.5))
    meta = output.meta
    # "Hello" is one token; exactly max_new_tokens are generated
    assert (meta.prompt_tokens, meta.completion_tokens, meta.cached_tokens) == (1, 3, 0)
    assert meta.finish_reason == "length"
    assert output.text
    assert meta.round_id and meta.position == 0 and meta.charge == 0.0
    await client.aclose()


async def test_stream_yields_deltas_that_add_up(sim):
    client = EngineClient()
    chunks = [c async for c in client.generate_stream(base_url=sim.url, body=body("c2"))]
    assert [c.meta.completion_tokens for c in chunks] == [1, 2, 3]
    # three synthetic words, one a chunk
    assert all(c.delta.strip() for c in chunks)
    assert len("".join(c.delta for c in chunks).split()) == 3
    await client.aclose()


async def test_closed_port_is_unavailable():
    client = EngineClient(connect_timeout_s=1)
    url = f"http://127.0.0.1:{dead_port()}"
    with pytest.raises(EngineUnavailable):
        await client.generate(base_url=url, body=body("c4"))
    with pytest.raises(EngineUnavailable):
        await anext(client.generate_stream(base_url=url, body=body("c5")))
    await client.aclose()


async def test_a_request_that_never_fits_is_rejected_with_the_engines_message(start_sim):
    sim = start_sim(settings=["kv_capacity_tokens=64"])
    client = EngineClient()
    with pytest.raises(EngineRejected) as caught:
        await client.generate(base_url=sim.url, body=body("c6", max_new_tokens=500))
    assert "can never fit" in caught.value.message
    assert caught.value.param == "sampling_params.max_new_tokens"
    await client.aclose()


async def fake_engine(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/generate", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


SGLANG_META = {
    "id": "x",
    "finish_reason": {"type": "stop", "matched": 2},
    "prompt_tokens": 9,
    "completion_tokens": 2,
    "cached_tokens": 4,
    "e2e_latency": 0.1,
}


# The auction's fields as SGLang's plugin sends them: customized_info, one value per output token
# with the plugin's at the first (what SGLang's tokenizer manager makes of req.customized_info).
SGLANG_AUCTION = {
    "bid": [0.5],
    "charge": [0.0125],
    "round_id": ["sglang@h:1:abc:7"],
    "position": [2],
    "planned_completion_s": [0.25],
    "time_saved_s": [0.125],
    "rank": [5],
    "ahead": [4],
    "queue_len": [9],
}


async def test_sglang_answers_carry_the_auction_fields_as_customized_info():
    async def handler(request: web.Request) -> web.StreamResponse:
        sent = await request.json()
        assert sent["rid"] == "s1" and sent["sampling_params"]["custom_params"] == {"bid": 0.5}
        return web.json_response({"text": "ab", "meta_info": {**SGLANG_META, **SGLANG_AUCTION}})

    runner, url = await fake_engine(handler)
    client = EngineClient()
    try:
        meta = (await client.generate(base_url=url, body=body("s1", bid=0.5))).meta
        assert (meta.bid, meta.charge, meta.round_id, meta.position) == (
            0.5, 0.0125, "sglang@h:1:abc:7", 2
        )  # fmt: skip
        assert (meta.rank, meta.ahead, meta.queue_len) == (5, 4, 9)
    finally:
        await client.aclose()
        await runner.cleanup()


async def test_sglang_answers_without_auction_fields():
    async def handler(request: web.Request) -> web.StreamResponse:
        sent = await request.json()
        assert sent["sampling_params"]["custom_params"] == {"bid": 0.5}
        if not sent["stream"]:
            return web.json_response({"text": "ab", "meta_info": SGLANG_META})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for text in ("a", "ab"):  # cumulative text, SGLang's default
            meta = {**SGLANG_META, "finish_reason": None, "completion_tokens": len(text)}
            await response.write(b"data: " + json.dumps({"text": text, "meta_info": meta}).encode())
            await response.write(b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    runner, url = await fake_engine(handler)
    client = EngineClient()
    try:
        output = await client.generate(base_url=url, body=body("s1", bid=0.5))
        meta = output.meta
        assert (meta.prompt_tokens, meta.cached_tokens, meta.completion_tokens) == (9, 4, 2)
        assert meta.finish_reason == "stop"
        assert (meta.bid, meta.charge, meta.round_id, meta.position) == (None, None, None, None)
        deltas = [
            c.delta async for c in client.generate_stream(base_url=url, body=body("s2", bid=0.5))
        ]
        assert deltas == ["a", "b"]
    finally:
        await client.aclose()
        await runner.cleanup()


@pytest.mark.parametrize(
    ("status", "payload", "headers", "error"),
    [
        (429, {"error": {"message": "full"}}, {"Retry-After": "3"}, EngineOverloaded),
        (400, {"error": {"message": "bad", "param": "text"}}, {}, EngineRejected),
        (503, {"error": {"message": "down"}}, {}, EngineUnavailable),
        (500, "not json", {}, EngineUnavailable),
    ],
)
async def test_statuses_become_typed_errors(status, payload, headers, error):
    async def handler(request: web.Request) -> web.Response:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        return web.Response(status=status, text=text, headers=headers)

    runner, url = await fake_engine(handler)
    client = EngineClient()
    try:
        with pytest.raises(error) as caught:
            await client.generate(base_url=url, body=body("e1"))
        if status == 429:
            assert caught.value.retry_after_s == 3.0
        if status == 400:
            assert (caught.value.message, caught.value.param) == ("bad", "text")
        with pytest.raises(error):
            await anext(client.generate_stream(base_url=url, body=body("e2")))
    finally:
        await client.aclose()
        await runner.cleanup()


async def test_malformed_answers_and_mid_stream_errors_are_unavailable():
    async def handler(request: web.Request) -> web.StreamResponse:
        sent = await request.json()
        if not sent["stream"]:
            return web.json_response({"text": "no meta_info"})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        meta = {**SGLANG_META, "finish_reason": None, "completion_tokens": 1}
        await response.write(b"data: " + json.dumps({"text": "a", "meta_info": meta}).encode())
        await response.write(b'\n\ndata: {"error": {"message": "engine died", "code": 503}}\n\n')
        return response

    runner, url = await fake_engine(handler)
    client = EngineClient()
    try:
        with pytest.raises(EngineUnavailable):
            await client.generate(base_url=url, body=body("m1"))
        stream = client.generate_stream(base_url=url, body=body("m2"))
        assert (await anext(stream)).delta == "a"
        with pytest.raises(EngineUnavailable, match="engine died"):
            await anext(stream)
    finally:
        await client.aclose()
        await runner.cleanup()


async def test_one_pooled_client_per_event_loop(sim):
    client = EngineClient()
    await client.generate(base_url=sim.url, body=body("p1"))
    first = client._client()
    await client.generate(base_url=sim.url, body=body("p2"))
    assert client._client() is first  # reused: pooled connections

    def other_loop() -> object:
        async def run() -> object:
            await client.generate(base_url=sim.url, body=body("p3"))
            return client._client()

        return asyncio.run(run())

    assert await asyncio.to_thread(other_loop) is not first
    await client.aclose()
