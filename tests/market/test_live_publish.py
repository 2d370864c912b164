"""Publishing: round records (the Redis stream's consumer) and the periodic tick, to the groups,
and on to a browser's socket."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from decimal import Decimal

import aiohttp
import httpx
import pytest
import redis
from django.conf import settings
from django.utils import timezone

from accounts.models import LedgerEntry
from accounts.money import money
from accounts.services import PriorityCharge, request_open, request_settle
from engines.contract.records import auction_fields
from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
from market.live import book, periodic, publisher, spend
from market.live.publisher import RoundsPublisher
from market.models import Market
from scheduler_bridge.settlement import stream as rounds
from tests.accounts.factories import market_create, tenant_create
from tests.market.live_helpers import LivePublishers, admitted, record, subtree
from tests.personas import logged_in, world_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, dict]]:
    """Every (group, payload) the publishers send, in order, instead of sending it."""
    messages: list[tuple[str, dict]] = []

    def many(pairs) -> bool:
        messages.extend(pairs)
        return True

    monkeypatch.setattr(publisher, "group_send_many", many)
    monkeypatch.setattr(spend, "group_send_many", many)
    monkeypatch.setattr(periodic, "group_send_many", many)
    monkeypatch.setattr(book, "group_send", lambda group, payload: many([(group, payload)]))
    return messages


def kinds(messages, group: str) -> list[str]:
    return [p["kind"] for g, p in messages if g == group]


@pytest.fixture
def market(unique_slug) -> Market:
    return market_create(unique_slug)


def open_requests(market: Market, tenant_slug: str, ids: list[str]) -> None:
    """Open requests, as the gateway does before forwarding them (queued, holds open)."""
    tenant = tenant_create(tenant_slug)
    for rid in ids:
        request_open(
            request_id=rid, tenant=tenant, api_key=None, market=market, bid="0.5", hold_amount="1"
        )


def gateway_settles(records: list[dict]) -> None:
    """Settle every request the records admit as the gateway does from its engine's answer (no
    tokens here): the priority charge and the round's view of the request are the answer's
    auction fields, the same as the record's (``auction_fields``)."""
    for rec in records:
        for entry in rec["admitted"]:
            fields = auction_fields(rec, entry)
            detail = {
                "bid": fields["bid"],
                "effective_bid": fields["effective_bid"],
                "time_saved_s": fields["time_saved_s"],
                "planned_completion_s": fields["planned_completion_s"],
                "position": fields["position"],
                "engine_charge": fields["charge"],
                "block": fields["block"],
                "engine": fields["engine"],
            }
            request_settle(
                request_id=entry["request_id"], prompt_tokens=0, cached_tokens=0,
                completion_tokens=0,
                priority=PriorityCharge(
                    amount=money(fields["charge"]), round_id=fields["round_id"], detail=detail
                ),
            )  # fmt: skip


def ledger() -> list[tuple]:
    return sorted(LedgerEntry.objects.values_list("request_id", "kind", "amount", "round_id"))


def three_rounds(market: str) -> list[dict]:
    """Three rounds admitting a1 (acme), b1 (globex), then a2 (acme); each reports a book."""
    return [
        record(market, 1, subtrees=[subtree("p", requests=3)], admitted_requests=[admitted("a1")]),
        record(market, 2, subtrees=[subtree("p", requests=2)], admitted_requests=[admitted("b1")]),
        record(market, 3, subtrees=[subtree("p", requests=1), subtree("q", position=1)],
               admitted_requests=[admitted("a2", charge=0.004)]),
    ]  # fmt: skip


def three_rounds_served(market: Market) -> list[dict]:
    """:func:`three_rounds`, their requests opened (a1, a2 of acme, b1 of globex) and settled
    by the gateway before the records are consumed."""
    rounds_ = three_rounds(market.slug)
    open_requests(market, "acme", ["a1", "a2"])
    open_requests(market, "globex", ["b1"])
    gateway_settles(rounds_)
    # 0.002 (a1) + 0.002 (b1) + 0.004 (a2), priority charges only.
    assert sum(amount for _, _, amount, _ in ledger()) == Decimal("0.008")
    return rounds_


def check_published(messages, market: str) -> None:
    """What three_rounds must have produced, whatever the timing within the throttle."""
    group = f"market.{market}"
    results = [p for g, p in messages if g == group and p["kind"] == "round.result"]
    assert sum(r["rounds"] for r in results) == 3 and sum(r["admitted"] for r in results) == 3
    assert sum(r["revenue"] for r in results) == pytest.approx(0.002 + 0.002 + 0.004)
    assert results[-1]["round_id"].endswith(":3")
    diffs = [p for g, p in messages if g == group and p["kind"] == "book.diff"]
    assert diffs[0]["version"] == 1 and diffs[-1]["round_id"].endswith(":3")  # the latest wins
    assert book.book_snapshot(market)["rows"][0]["requests"] == 1
    ticks = {p["tenant"]: p for g, p in messages if p["kind"] == "spend.tick"}
    assert set(ticks) == {"acme", "globex"}
    acme_rows = {r["request_id"] for g, p in messages if g == "tenant.acme" for r in p["requests"]}
    assert acme_rows == {"a1", "a2"}
    # b1's id as a JSON string anywhere (a bare substring matched random market slugs)
    assert not any('"b1"' in json.dumps(p) for g, p in messages if g == "tenant.acme")
    a2 = next(
        r
        for g, p in messages
        if g == "tenant.acme"
        for r in p["requests"]
        if r["request_id"] == "a2"
    )
    assert a2["priority_charge"] == "0.004000000" and a2["block_bid_mean"] == 0.25
    assert a2["position"] == 1 and a2["time_saved_s"] == 0.125 and a2["status"] == "served"
    assert a2["engine"] == "sim@test"  # the replica that ranked it, as its answer said


def consumed(records: list[dict]) -> rounds.ConsumeStats:
    """``records`` written to a stream of their own and taken by the stream's consumer."""
    client = rounds.redis_client(settings.REDIS_URL)
    stream = f"test-live:{uuid.uuid4().hex}"
    try:
        for r in records:
            client.xadd(stream, {"record": json.dumps(r)})
        sc = rounds.StreamConsumer(client=client, stream=stream, consumer="t")
        return rounds.rounds_consume(sc=sc, until_idle=True, publisher=RoundsPublisher())
    finally:
        client.delete(stream)
        client.close()


def test_the_stream_consumer_publishes_what_it_takes(sent, market) -> None:
    served = three_rounds_served(market)
    before = ledger()
    stats = consumed(served)
    assert (stats.taken, stats.admitted) == (3, 3)
    assert ledger() == before  # round records move no money
    check_published(sent, market.slug)


def test_results_and_ticks_are_throttled_per_market_and_tenant(sent, market) -> None:
    open_requests(market, "acme", ["a1", "a2"])
    now = [100.0]
    pub = RoundsPublisher(clock=lambda: now[0])
    pub.settled(record(market.slug, 1, admitted_requests=[admitted("a1")]))
    assert kinds(sent, f"market.{market.slug}") == ["round.result"]
    assert kinds(sent, "tenant.acme") == ["spend.tick"]
    now[0] = 100.2  # within 0.5 s: held back
    pub.settled(record(market.slug, 2, admitted_requests=[admitted("a2")]))
    assert len(kinds(sent, f"market.{market.slug}")) == 1 and len(kinds(sent, "tenant.acme")) == 1
    now[0] = 100.6
    pub.tick()
    results = [p for g, p in sent if p["kind"] == "round.result"]
    assert [r["rounds"] for r in results] == [1, 1] and results[1]["round_id"].endswith(":2")
    ticks = [p for g, p in sent if g == "tenant.acme"]
    assert [r["request_id"] for r in ticks[1]["requests"]] == ["a2"]
    assert not pub.pending()


def test_a_publishing_failure_never_stops_the_consumer(monkeypatch, market) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("the channel layer is down")

    monkeypatch.setattr(publisher, "book_publish", broken)
    monkeypatch.setattr(publisher, "group_send_many", broken)
    open_requests(market, "acme", ["a1", "a2"])
    open_requests(market, "globex", ["b1"])
    stats = consumed(three_rounds(market.slug))
    assert (stats.read, stats.taken, stats.admitted) == (3, 3, 3)


@pytest.mark.django_db(transaction=True)
def test_the_periodic_tick_sends_engine_status_idle_books_and_token_spend(sent, market) -> None:
    with ServerThread(ServerOptions.of(port=0, speed=20, market=market.slug)) as sim:
        Market.objects.filter(pk=market.pk).update(engine_url=sim.url)
        # A book published a while ago, while the engine now reports an empty queue.
        rec = record(market.slug, 1, subtrees=[subtree("p")])
        book.book_publish(record=rec, rows=book.book_rows(rec), now=time.time() - 5)
        # A request completes (token charge, in the gateway): its tenant gets a tick.
        open_requests(market, "acme", ["a1"])
        request_settle(
            request_id="a1", prompt_tokens=1000, cached_tokens=0, completion_tokens=100,
            ttft_s=0.5, e2e_s=1.5, now=timezone.now(),
        )  # fmt: skip
        assert httpx.get(f"{sim.url}/health", timeout=5).status_code == 200
        tick = periodic.live_tick()
    assert tick.engines_up == 1 and tick.books_cleared == 1 and tick.tenants == 1
    group = f"market.{market.slug}"
    status = next(p for g, p in sent if g == group and p["kind"] == "engine.status")
    assert status["up"] and status["queue"] == 0
    *_, cleared = (p for g, p in sent if g == group and p["kind"] == "book.diff")
    assert cleared["removed"] == ["p"] and cleared["version"] == 2
    acme = next(p for g, p in sent if g == "tenant.acme")
    (row,) = acme["requests"]
    # $3 per million uncached input tokens x 1000 + $15 per million output x 100 = $0.0045
    assert row["token_charge"] == "0.004500000" and row["ttft_s"] == 0.5
    assert Decimal(acme["spent_today"]) == Decimal("0.0045")
    # No budget: the window is this UTC month.
    assert acme["budget"] is None and acme["spent_window"] == "0.004500000"


def test_redis_is_reachable_for_the_live_tests() -> None:
    assert redis.Redis.from_url(settings.REDIS_URL).ping()


@pytest.mark.django_db(transaction=True)
def test_records_an_engine_writes_to_the_stream_reach_a_browser_socket(
    asgi_server, tmp_path, client, unique_slug
) -> None:
    """From the Redis stream, through ``manage.py rounds_consume`` (a process of its own) and
    the Redis channel layer, to a websocket of the web server."""
    world = world_create(market_slug=unique_slug)
    logged_in(client, world, "operator")
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    stream = f"imtest:rounds:{unique_slug}"
    publishers = LivePublishers(stream, tmp_path / "rounds_consume.log")
    writer = redis.Redis.from_url(settings.REDIS_URL)

    async def watch() -> dict[str, dict]:
        url = f"ws://127.0.0.1:{asgi_server.port}/ws/markets/{unique_slug}/"
        headers = {"Cookie": cookie, "Origin": asgi_server.url}
        seen: dict[str, dict] = {}
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(url, headers=headers) as ws:
                rec = record(unique_slug, 1, subtrees=[subtree("k", requests=3)])
                writer.xadd(stream, {"record": json.dumps(rec)})  # what the engine does
                while not {"book.diff", "round.result"} <= set(seen):
                    message = await asyncio.wait_for(ws.receive_json(), timeout=30)
                    seen[message["kind"]] = message
        return seen

    try:
        seen = asyncio.run(watch())
    finally:
        publishers.stop()
        writer.delete(stream, f"{stream}:dead")
        writer.close()
    assert [r["key"] for r in seen["book.diff"]["changed"]] == ["k"]
    assert seen["round.result"]["rounds"] == 1
