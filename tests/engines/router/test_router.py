"""SGLang's real model gateway (smg 1.13.0) in front of simulated replicas, which it finds by
probing them (no registration call): the bid and the tenant's tag travel through it as fields
and price the request, on every replica, streamed or not; a replica killed leaves the rotation
and comes back when restarted; with no replica left, every answer is an engine failure. No
mock: the gateway is the one a deployment runs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from config.management.commands.live_market import (
    DEMO_PREFIX_HASH_ABS_THRESHOLD,
    DEMO_PREFIX_HASH_LOAD_FACTOR,
)
from engines.client import EngineClient, EngineError, EngineUnavailable, generate_body
from engines.router import (
    CONTROL_KEY_ENV,
    Router,
    RouterOptions,
    control_key_args,
    router_argv,
    router_env,
    router_ready,
)
from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
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
    body = generate_body(
        rid=rid, max_new_tokens=kw.pop("tokens", 4), bid=bid, text=prompt(rid),
        owner=kw.pop("owner", ""),
    )  # fmt: skip
    return await client.generate(base_url=url, body=body, **kw)


def queued_behind_a_first(url: str, bids: dict[str, float], owners: dict[str, str]) -> dict:
    """A first request that runs long, then ``bids`` sent together (they wait behind it on a
    replica that runs one at a time): the answers, by request id."""

    async def scenario():
        client = EngineClient()
        try:
            blocker = asyncio.create_task(generate(client, url, "first", 0.0, tokens=200))
            await asyncio.sleep(0.2)  # it is running: the others wait together
            answers = await asyncio.gather(
                *(generate(client, url, rid, bid, owner=owners[rid]) for rid, bid in bids.items())
            )
            await blocker
            return dict(zip(bids, answers, strict=True))
        finally:
            await client.aclose()

    return asyncio.run(scenario())


@pytest.mark.parametrize("charge_scope", ["request", "tenant"])
def test_the_bid_and_the_tenant_pass_the_gateway_and_price_the_request(charge_scope) -> None:
    # One replica that runs one request at a time, so that three bidders queue behind a first;
    # "hi" and "mid" are one tenant's, "lo" another's.
    settings = ("max_running_requests=1", f"charge_scope={charge_scope}")
    bids = {"hi": 0.4, "mid": 0.2, "lo": 0.1}
    owners = {"hi": "acme", "mid": "acme", "lo": "globex"}
    with replicas("solo", settings=settings) as (solo,), router([solo]) as front:
        answers = queued_behind_a_first(front.url, bids, owners)
    metas = {rid: a.meta for rid, a in answers.items()}
    assert {rid: m.bid for rid, m in metas.items()} == bids  # what the gateway checks
    by_rid = {a["request_id"]: (r, a) for r in solo.records for a in r["admitted"]}
    # Served by bid (equal prompt lengths), one per round as the replica runs one at a time.
    assert sorted(bids, key=lambda rid: by_rid[rid][0]["seq"]) == ["hi", "mid", "lo"]
    hi_round, hi = by_rid["hi"]
    assert hi_round["waiting"] == 3 and hi["position"] == 0
    hi_s, mid_s = hi["planned_completion_s"], by_rid["mid"][1]["planned_completion_s"]
    if charge_scope == "request":
        # The first of the three delays the other two by its own planned time: it pays their
        # bids for it (docs/mechanism.md, "Payments"); the last delays no one and pays nothing.
        assert metas["hi"].charge == pytest.approx((0.2 + 0.1) * hi_s)
    else:
        # Tenant-level charges: "hi" is not billed for delaying "mid", its own tenant's, only
        # for "lo" (globex's). That the replica told them apart is the tag arriving.
        assert metas["hi"].charge == pytest.approx(0.1 * hi_s)
    assert metas["mid"].charge == pytest.approx(0.1 * mid_s)
    assert metas["lo"].charge == 0.0
    assert metas["hi"].charge == hi["charge"]  # the answer says what the record says


def test_bids_reach_three_replicas_unchanged_streamed_and_not() -> None:
    # Round robin: each replica gets requests. Bids with many digits, as the client sends them.
    bids = {f"b{i}": round(0.001 + i * 0.0370370370370371, 15) for i in range(12)}
    streamed = {rid for i, rid in enumerate(bids) if i % 2}
    with replicas("t1", "t2", "t3") as reps, router(reps, "round_robin") as front:

        async def send(client: EngineClient, rid: str) -> tuple[float | None, float | None]:
            body = generate_body(rid=rid, max_new_tokens=3, bid=bids[rid], text=prompt(rid),
                                 stream=rid in streamed, owner="t-1")  # fmt: skip
            if rid not in streamed:
                meta = (await client.generate(base_url=front.url, body=body)).meta
                return meta.bid, meta.bid
            chunks = [c async for c in client.generate_stream(base_url=front.url, body=body)]
            return chunks[0].meta.bid, chunks[-1].meta.bid

        async def scenario():
            client = EngineClient()
            try:
                return {rid: await send(client, rid) for rid in bids}
            finally:
                await client.aclose()

        reported = asyncio.run(scenario())
    assert reported == {rid: (bid, bid) for rid, bid in bids.items()}
    # What each replica read, from its own round records: the bid sent, under the rid sent.
    read = {a["request_id"]: a["bid"] for r in reps for rec in r.records for a in rec["admitted"]}
    assert read == bids
    assert all(len(r.served()) == 4 for r in reps)  # 12 requests, round robin over 3


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


@pytest.mark.parametrize("demo", [False, True], ids=["smg", "demo"])
def test_prefix_hash_moves_a_prefix_off_its_loaded_replica_only_under_the_demos_settings(
    demo: bool,
) -> None:
    """One system prompt (longer than the 1024 characters prefix_hash hashes), 12 requests at
    once, replicas that run one at a time: under smg's own overload test (above 1.25 x the mean
    and above it by 10 requests) all 12 stay on the prompt's replica and the other idles (the
    demo's two prompts on one replica); under live_market's both serve about half."""
    settings = ("max_running_requests=1", "step_fixed_s=0.02")
    with replicas("h1", "h2", settings=settings) as reps:
        options = RouterOptions(
            port=dead_port(), worker_urls=tuple(r.url for r in reps), policy="prefix_hash",
            prefix_hash_balance_abs_threshold=DEMO_PREFIX_HASH_ABS_THRESHOLD if demo else None,
            prefix_hash_load_factor=DEMO_PREFIX_HASH_LOAD_FACTOR if demo else None,
        )  # fmt: skip
        with Router(options) as front:

            async def burst() -> None:
                client = EngineClient()
                head = " ".join(f"rule{i}" for i in range(200))  # 1290 characters
                try:
                    await asyncio.gather(*(
                        client.generate(base_url=front.url, body=generate_body(
                            rid=f"b{i}", max_new_tokens=20, bid=0.1, text=f"{head} question {i}"
                        ))
                        for i in range(12)
                    ))  # fmt: skip
                finally:
                    await client.aclose()

            asyncio.run(burst())
    served = sorted(len(r.served()) for r in reps)
    assert sum(served) == 12
    if demo:
        assert served[0] >= 4, served  # within a request or two of even
    else:
        assert served == [0, 12]


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
        # Until its health checks fail, the gateway may still send to it: those fail as 5xx.
        front.wait_ready(1, timeout_s=30)
        early = asyncio.run(burst("early", 4))
        assert all(isinstance(a, EngineError) for a in early if isinstance(a, Exception))
        deadline = time.monotonic() + 30
        while True:  # the router drops the dead replica within a few health checks
            answers = asyncio.run(burst("after", 4))
            if all(not isinstance(a, Exception) for a in answers):
                break
            assert time.monotonic() < deadline, "the gateway kept sending to a dead replica"
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
    assert router_ready(front.url, 1) is False  # the gateway was stopped with its block


def test_with_no_replica_left_every_answer_is_an_engine_failure() -> None:
    with replicas("last") as (only,), router([only]) as front:
        only.stop()

        async def after(n: int) -> list[object]:
            client = EngineClient()
            try:
                return [
                    await asyncio.gather(generate(client, front.url, f"x{i}", 0.25),
                                         return_exceptions=True)
                    for i in range(n)
                ]  # fmt: skip
            finally:
                await client.aclose()

        answers = [a for (a,) in asyncio.run(after(4))]
    # smg answers the first requests 500 (it tried the dead replica), then 503 (no worker
    # left); the client takes both as the engine being unavailable, what the gateway answers
    # 503 with nothing charged.
    assert all(isinstance(a, EngineUnavailable) for a in answers), answers
    assert {a.status for a in answers} <= {500, 503}


def test_the_command_line_maps_the_markets_settings_one_to_one() -> None:
    urls = ("http://127.0.0.1:30001", "http://127.0.0.1:30002")
    argv = router_argv(RouterOptions(port=30000, worker_urls=urls, prometheus_port=29999))
    line = " ".join(argv[1:])
    assert line.startswith("-m engines.router --host 127.0.0.1 --port 30000 ")
    assert f"--worker-urls {urls[0]} {urls[1]} --policy prefix_hash " in line
    # The market's health and circuit settings, each to smg's flag of the same meaning.
    assert "--health-check-interval-secs 2 --health-failure-threshold 2 " in line
    assert "--cb-failure-threshold 2 --cb-timeout-duration-secs 5 " in line
    assert "--prometheus-host 127.0.0.1 --prometheus-port 29999 " in line
    # Routing: smg's own thresholds, without its worker-overload protection (the benchmark's
    # choice); its priority scheduler off (it would queue requests in the gateway, out of the
    # auction's reach); its control key in its environment, never on its command line.
    assert line.endswith(" --disable-worker-overload-protection")
    for flag in ("--cache-threshold", "--balance-abs-threshold", "--balance-rel-threshold",
                 "--prefix-token-count", "--prefix-hash-load-factor",
                 "--prefix-hash-balance-abs-threshold", "--priority-scheduler-enabled",
                 "--control-plane-api-keys"):  # fmt: skip
        assert flag not in argv
    hashed = RouterOptions(
        port=30000, worker_urls=urls, prefix_token_count=64, prefix_hash_load_factor=1.1,
        prefix_hash_balance_abs_threshold=0,
    )  # fmt: skip
    assert (
        "--prefix-token-count 64 --prefix-hash-load-factor 1.1 "
        "--prefix-hash-balance-abs-threshold 0 " in " ".join(router_argv(hashed))
    )
    protected = RouterOptions(port=30000, worker_urls=urls, worker_overload_protection=True)
    assert "--disable-worker-overload-protection" not in router_argv(protected)
    opened = RouterOptions(
        port=30000, worker_urls=urls, balance_abs_threshold=100_000, balance_rel_threshold=1000.0,
        worker_overload_protection=False, cache_threshold=0.5,
    )  # fmt: skip
    line = " ".join(router_argv(opened))
    assert (
        "--cache-threshold 0.5 --balance-abs-threshold 100000 --balance-rel-threshold 1000.0 "
        in line
    )
    assert line.endswith(" --disable-worker-overload-protection")


def test_every_router_has_a_control_key_in_its_environment_not_on_its_command_line() -> None:
    urls = ("http://10.0.0.2:30001",)
    given = RouterOptions(port=30000, worker_urls=urls, host="0.0.0.0", control_key="s3cret")
    assert "s3cret" not in " ".join(router_argv(given)) and "s3cret" not in repr(given)
    env = router_env({"PATH": "/bin", CONTROL_KEY_ENV: "an operator's"}, given)
    assert env[CONTROL_KEY_ENV] == "s3cret" and env["PATH"] == "/bin"
    assert control_key_args("s3cret") == ["--control-plane-api-keys", "market:market:admin:s3cret"]
    # None given, on loopback or not: a random key of its own, a fresh one each time.
    keys = {RouterOptions(port=30000, worker_urls=urls, host=h).control_key
            for h in ("127.0.0.1", "127.0.0.1", "0.0.0.0")}  # fmt: skip
    assert len(keys) == 3 and all(len(k) >= 32 for k in keys)
    for blank in ("", " "):
        with pytest.raises(ValueError, match="blank"):
            RouterOptions(port=30000, worker_urls=urls, control_key=blank)
    # The command without its key in the environment does not start smg at all.
    bare = {k: v for k, v in os.environ.items() if k != CONTROL_KEY_ENV}
    done = subprocess.run(
        router_argv(given), env=bare, capture_output=True, text=True, timeout=60
    )  # fmt: skip
    assert done.returncode != 0 and f"{CONTROL_KEY_ENV} is not set" in done.stderr


def test_the_control_plane_refuses_whoever_has_no_key_and_the_data_plane_serves() -> None:
    with replicas("key1") as reps:
        options = RouterOptions(port=dead_port(), worker_urls=(reps[0].url,))  # a random key
        with Router(options) as front:  # it waited for the worker with the key
            assert router_ready(front.url, 1) is False  # no key: the control plane refuses
            assert router_ready(front.url, 1, control_key="wrong") is False
            assert router_ready(front.url, 1, control_key=options.control_key) is True
            keyed = {"Authorization": f"Bearer {options.control_key}"}
            (worker,) = httpx.get(f"{front.url}/workers", headers=keyed).json()["workers"]
            for method, path, body in (
                ("POST", "/workers", {"url": "http://127.0.0.1:9"}),
                ("DELETE", f"/workers/{worker['id']}", None),
                ("POST", "/flush_cache", None),
            ):
                answer = httpx.request(method, f"{front.url}{path}", json=body)
                assert answer.status_code == 401, (method, path, answer.text)
            (still,) = httpx.get(f"{front.url}/workers", headers=keyed).json()["workers"]
            assert still["id"] == worker["id"] and still["url"] == reps[0].url
            answer = asyncio.run(_one(front.url))  # the data plane needs no key
    assert answer.meta.bid == 0.125


async def _one(url: str):
    client = EngineClient()
    try:
        return await generate(client, url, "keyed", 0.125)
    finally:
        await client.aclose()
