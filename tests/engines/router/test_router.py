"""The real SGLang router (sglang-router 0.3.2's binary) in front of simulated replicas: the
bid survives it and prices the request, streaming passes through, a replica killed leaves the
rotation and comes back when restarted. No mock: the router is the one a deployment runs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from engines.router import Router, RouterOptions, router_ready
from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
from scheduler_bridge.client import EngineClient, EngineError, generate_body
from tests.conftest import ENGINE_ADMIN_TOKEN, dead_port

PROMPT_WORDS = 40


class Replica:
    """A simulated engine in a thread, and the round records it emitted."""

    def __init__(self, engine_id: str, *, port: int = 0, settings: tuple[str, ...] = ()) -> None:
        options = ServerOptions.of(
            port=port,
            speed=1.0,
            engine_id=engine_id,
            settings=settings,
            admin_token=ENGINE_ADMIN_TOKEN,
        )
        self.thread = ServerThread(options)
        self.engine_id = engine_id
        self.records: list[dict] = []
        self._lock = threading.Lock()

    def start(self) -> Replica:
        self.thread.start()
        self.thread.call(lambda: self.thread.server.callbacks.callbacks.append(self._keep))
        return self

    def _keep(self, record: dict) -> None:
        with self._lock:
            self.records.append(record)

    def served(self) -> set[str]:
        with self._lock:
            return {a["request_id"] for r in self.records for a in r["admitted"]}

    @property
    def url(self) -> str:
        return self.thread.url

    @property
    def port(self) -> int:
        return self.thread.port

    def stop(self) -> None:
        self.thread.stop()


@contextmanager
def replicas(*ids: str, settings: tuple[str, ...] = ()) -> Iterator[list[Replica]]:
    started = [Replica(i, settings=settings).start() for i in ids]
    try:
        yield started
    finally:
        for r in started:
            r.stop()


@contextmanager
def router(reps: list[Replica], policy: str = "cache_aware") -> Iterator[Router]:
    options = RouterOptions(port=dead_port(), worker_urls=tuple(r.url for r in reps), policy=policy)
    with Router(options) as started:
        yield started


def prompt(tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(PROMPT_WORDS))


async def generate(client: EngineClient, url: str, rid: str, bid: float, **kw):
    body = generate_body(rid=rid, max_new_tokens=kw.pop("tokens", 4), bid=bid, text=prompt(rid))
    return await client.generate(base_url=url, body=body, **kw)


def test_the_bid_survives_the_router_and_prices_the_request() -> None:
    # One replica that runs one request at a time, so that three bidders queue behind a first.
    with (
        replicas("solo", settings=("max_running_requests=1",)) as (solo,),
        router([solo]) as front,
    ):
        bids = {"hi": 0.4, "mid": 0.2, "lo": 0.1}

        async def scenario():
            client = EngineClient()
            try:
                blocker = asyncio.create_task(generate(client, front.url, "first", 0.0, tokens=200))
                await asyncio.sleep(0.2)  # it is running: the others wait together
                answers = await asyncio.gather(
                    *(generate(client, front.url, rid, bid) for rid, bid in bids.items())
                )
                await blocker
                return dict(zip(bids, answers, strict=True))
            finally:
                await client.aclose()

        answers = asyncio.run(scenario())
    metas = {rid: a.meta for rid, a in answers.items()}
    assert {rid: m.bid for rid, m in metas.items()} == bids  # what the gateway checks
    by_rid = {a["request_id"]: (r, a) for r in solo.records for a in r["admitted"]}
    # Served by bid (equal prompt lengths), one per round as the replica runs one at a time.
    assert sorted(bids, key=lambda rid: by_rid[rid][0]["seq"]) == ["hi", "mid", "lo"]
    # The first of the three delays the other two by its own planned time: it pays their bids
    # for it (DESIGN.md 4.4); the last delays no one and pays nothing.
    hi_round, hi = by_rid["hi"]
    assert hi_round["waiting"] == 3 and hi["position"] == 0
    assert metas["hi"].charge == pytest.approx((0.2 + 0.1) * hi["planned_completion_s"])
    assert metas["mid"].charge == pytest.approx(0.1 * by_rid["mid"][1]["planned_completion_s"])
    assert metas["lo"].charge == 0.0
    assert metas["hi"].charge == hi["charge"]  # the answer says what the record says


def test_streaming_passes_through_with_the_bid_in_the_first_chunk() -> None:
    with replicas("s1", "s2") as reps, router(reps) as front:

        async def stream():
            client = EngineClient()
            body = generate_body(rid="st", max_new_tokens=5, bid=0.25, text=prompt("st"))
            try:
                return [c async for c in client.generate_stream(base_url=front.url, body=body)]
            finally:
                await client.aclose()

        chunks = asyncio.run(stream())
    assert len(chunks) == 5 and all(c.delta for c in chunks)
    assert chunks[0].meta.bid == 0.25 and chunks[-1].meta.finish_reason == "length"
    assert sum(1 for r in reps if "st" in r.served()) == 1


def test_cache_aware_keeps_a_prefix_on_one_replica() -> None:
    with replicas("c1", "c2") as reps, router(reps, "cache_aware") as front:

        async def shared_prefix():
            client = EngineClient()
            head = prompt("system")
            try:
                for i in range(6):
                    body = generate_body(
                        rid=f"p{i}", max_new_tokens=2, bid=0.1, text=f"{head} question {i}"
                    )
                    await client.generate(base_url=front.url, body=body)
            finally:
                await client.aclose()

        asyncio.run(shared_prefix())
    served = [r.served() for r in reps]
    assert sorted(len(s) for s in served) == [0, 6]  # all six on the replica that has the head


def test_a_killed_replica_leaves_the_rotation_and_returns_when_restarted() -> None:
    with replicas("k1", "k2") as (alive, doomed), router([alive, doomed], "round_robin") as front:
        port = doomed.port

        async def burst(tag: str, n: int) -> list[object]:
            client = EngineClient()
            try:
                return await asyncio.gather(
                    *(generate(client, front.url, f"{tag}{i}", 0.05) for i in range(n)),
                    return_exceptions=True,
                )
            finally:
                await client.aclose()

        assert all(not isinstance(a, Exception) for a in asyncio.run(burst("before", 4)))
        assert doomed.served()  # round robin used both
        doomed.stop()
        # Until its health checks fail, the router may still send to it: those fail as 5xx.
        front.wait_ready(1, timeout_s=30)
        early = asyncio.run(burst("early", 4))
        assert all(isinstance(a, EngineError) for a in early if isinstance(a, Exception))
        deadline = time.monotonic() + 30
        while True:  # the router drops the dead replica within a few health checks
            answers = asyncio.run(burst("after", 4))
            if all(not isinstance(a, Exception) for a in answers):
                break
            assert time.monotonic() < deadline, "the router kept sending to a dead replica"
            time.sleep(1)
        back = Replica("k2", port=port).start()
        try:
            front.wait_ready(2, timeout_s=30)
            deadline = time.monotonic() + 30
            while not back.served():
                assert time.monotonic() < deadline, "the restarted replica got no request"
                assert all(not isinstance(a, Exception) for a in asyncio.run(burst("again", 4)))
        finally:
            back.stop()
    assert router_ready(front.url, 1) is False  # the router was stopped with its block
