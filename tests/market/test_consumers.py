"""The websocket routes: who may connect, what each receives, one handler per message type.

Personas (as in the page tests): an operator (staff), tenant A's admin and viewer, tenant B's
admin, and an anonymous visitor. The market socket is for operators; a tenant's socket for its
members and operators; nobody receives another tenant's data, and the book is anonymous.
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from config.asgi import application
from market.live import book
from market.live.publisher import RoundsPublisher
from market.live.send import group_send
from market.live.spend import spend_ticks_publish
from market.payloads import BookRow, RoundResult, layer_message, market_group
from tests.accounts.factories import spend
from tests.market.live_helpers import admitted, record, session_cookie, subtree
from tests.personas import PERSONAS, World, logged_in, world_create

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def world(unique_slug) -> World:
    return world_create(market_slug=unique_slug)


async def connect(path: str, headers) -> tuple[WebsocketCommunicator, bool]:
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=5)
    return communicator, connected


async def as_persona(client, world: World, persona: str, path: str):
    await sync_to_async(logged_in)(client, world, persona)
    return await connect(path, session_cookie(client))


@pytest.mark.parametrize("persona", PERSONAS)
async def test_the_market_socket_is_for_operators_only(client, world, persona) -> None:
    communicator, connected = await as_persona(
        client, world, persona, f"/ws/markets/{world.market.slug}/"
    )
    assert connected == (persona == "operator")
    await communicator.disconnect()


async def test_an_unknown_market_is_refused_even_to_operators(client, world) -> None:
    communicator, connected = await as_persona(client, world, "operator", "/ws/markets/nope/")
    assert not connected


@pytest.mark.parametrize("persona", PERSONAS)
async def test_a_tenant_socket_is_for_its_members_and_operators(client, world, persona) -> None:
    communicator, connected = await as_persona(client, world, persona, "/ws/tenants/acme/")
    assert connected == (persona in ("operator", "a_admin", "a_viewer"))
    await communicator.disconnect()


async def test_a_foreign_origin_is_refused(client, world) -> None:
    await sync_to_async(logged_in)(client, world, "operator")
    headers = [(b"origin", b"http://evil.example"), *session_cookie(client)[1:]]
    _, connected = await connect(f"/ws/markets/{world.market.slug}/", headers)
    assert not connected


async def test_snapshot_on_connect_then_diffs_and_a_resync(client, world) -> None:
    slug = world.market.slug
    first = record(slug, 1, subtrees=[subtree("a"), subtree("b", position=2)])
    await sync_to_async(book.book_publish)(record=first, rows=book.book_rows(first), now=1.0)
    communicator, connected = await as_persona(client, world, "operator", f"/ws/markets/{slug}/")
    assert connected
    snapshot = await communicator.receive_json_from(timeout=5)
    assert snapshot["kind"] == "book.snapshot" and snapshot["version"] == 1
    assert [r["key"] for r in snapshot["rows"]] == ["a", "b"]

    second = record(slug, 2, subtrees=[subtree("a"), subtree("c", position=1)])
    await sync_to_async(book.book_publish)(record=second, rows=book.book_rows(second), now=2.0)
    diff = await communicator.receive_json_from(timeout=5)
    assert (diff["kind"], diff["base"], diff["version"]) == ("book.diff", 1, 2)
    assert [r["key"] for r in diff["changed"]] == ["c"] and diff["removed"] == ["b"]

    await communicator.send_json_to({"type": "book.resync"})
    again = await communicator.receive_json_from(timeout=5)
    assert again["kind"] == "book.snapshot" and again["version"] == 2
    assert [r["key"] for r in again["rows"]] == ["a", "c"]  # by position: a at 0, c at 1
    await communicator.disconnect()


async def test_each_message_type_reaches_the_operators(client, world) -> None:
    slug = world.market.slug
    communicator, _ = await as_persona(client, world, "operator", f"/ws/markets/{slug}/")
    result: RoundResult = {
        "kind": "round.result", "market": slug, "at": 1.0, "round_id": "e:1:1", "rounds": 2,
        "admitted": 3, "revenue": 0.01, "welfare": -0.5, "waiting": 4,
        "policy": "fcfs", "reserve": 0.002,
    }  # fmt: skip
    await sync_to_async(group_send)(market_group(slug), result)
    assert await communicator.receive_json_from(timeout=5) == result
    # The tenants' spend lines go to every console.
    await sync_to_async(spend_ticks_publish)(requests_by_tenant={world.a.pk: []})
    line = await communicator.receive_json_from(timeout=5)
    assert (line["kind"], line["tenant"], line["name"]) == ("tenant.spend", "acme", "Tenant ACME")
    await communicator.disconnect()


async def test_tenants_receive_their_own_spend_only(client, world) -> None:
    await sync_to_async(spend)(
        tenant=world.b, market=world.market, request_id="b-req-1", charge=0.5, at=_now()
    )
    await sync_to_async(spend)(
        tenant=world.a, market=world.market, request_id="a-req-1", charge=0.25, at=_now()
    )
    communicator, connected = await as_persona(client, world, "a_viewer", "/ws/tenants/acme/")
    assert connected
    await sync_to_async(spend_ticks_publish)(
        requests_by_tenant={world.b.pk: ["b-req-1"], world.a.pk: ["a-req-1"]}
    )
    tick = await communicator.receive_json_from(timeout=5)
    assert tick["kind"] == "spend.tick" and tick["tenant"] == "acme"
    assert [r["request_id"] for r in tick["requests"]] == ["a-req-1"]
    assert tick["spent_today"] == "0.250000000"
    assert await communicator.receive_nothing(timeout=0.3)  # B's tick never arrives
    assert "globex" not in json.dumps(tick).lower() and "b-req" not in json.dumps(tick)
    await communicator.disconnect()


async def test_the_book_and_round_results_are_anonymous(client, world) -> None:
    """A round admitting B's requests reaches the console with no request id, no tenant and
    no single bid: only subtree aggregates."""
    await sync_to_async(spend)(
        tenant=world.b, market=world.market, request_id="b-req-9", charge=0.5, at=_now()
    )
    slug = world.market.slug
    communicator, _ = await as_persona(client, world, "operator", f"/ws/markets/{slug}/")
    rec = record(
        slug, 1, subtrees=[subtree("a", requests=3, bid_sum=0.75)],
        admitted_requests=[admitted("b-req-9", bid=0.123456)],
    )  # fmt: skip
    publisher = RoundsPublisher()
    await sync_to_async(publisher.settled)(rec)
    await sync_to_async(publisher.flush)()
    seen = []
    while not await communicator.receive_nothing(timeout=0.3):
        seen.append(await communicator.receive_json_from())
    kinds = sorted(m["kind"] for m in seen)
    assert kinds == ["book.diff", "round.result", "tenant.spend"]
    for message in seen:
        if message["kind"] == "tenant.spend":
            continue  # the operators' tenants table: names and spend, no requests or bids
        text = json.dumps(message)
        assert "b-req" not in text and "globex" not in text.lower() and "0.123456" not in text
    diff = next(m for m in seen if m["kind"] == "book.diff")
    # Only the aggregate fields (a market of replicas adds each replica's request count).
    aggregates = set(BookRow.__annotations__) - {"replicas"}
    assert all(set(r) == aggregates for r in diff["changed"])
    result = next(m for m in seen if m["kind"] == "round.result")
    assert (result["admitted"], result["rounds"]) == (1, 1)
    assert result["revenue"] == pytest.approx(0.002)
    assert result["welfare"] == pytest.approx(-0.123456 * 0.25)
    assert "requests" not in next(m for m in seen if m["kind"] == "tenant.spend")
    await communicator.disconnect()


async def test_the_in_memory_layer_works_too(settings, client, world) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    slug = world.market.slug
    communicator, _ = await as_persona(client, world, "operator", f"/ws/markets/{slug}/")
    status = {"kind": "engine.status", "market": slug, "at": 1.0, "up": False, "error": "down",
              "queue": None, "running": None, "cache_hit_rate": None, "tokens_per_second": None,
              "prompt_tokens_per_second": None, "ttft_p50_s": None, "ttft_p99_s": None,
              "window_s": None}  # fmt: skip
    await get_channel_layer().group_send(market_group(slug), layer_message(status))
    assert await communicator.receive_json_from(timeout=5) == status
    await communicator.disconnect()


def _now():
    from django.utils import timezone

    return timezone.now()


async def test_a_frame_that_is_not_json_is_dropped_and_the_feed_goes_on(client, world) -> None:
    """Issue 30: one non-JSON text frame closed the sender's socket with a traceback."""
    slug = world.market.slug
    first = record(slug, 1, subtrees=[subtree("a")])
    await sync_to_async(book.book_publish)(record=first, rows=book.book_rows(first), now=1.0)
    communicator, connected = await as_persona(client, world, "operator", f"/ws/markets/{slug}/")
    assert connected
    assert (await communicator.receive_json_from(timeout=5))["kind"] == "book.snapshot"
    await communicator.send_to(text_data="not json {")
    await communicator.send_to(bytes_data=b"\x00\xff")
    await communicator.send_to(text_data="[" * 100_000)  # deeper than the decoder goes
    # Still open and answering: a resync is a fresh snapshot.
    await communicator.send_json_to({"type": "book.resync"})
    again = await communicator.receive_json_from(timeout=5)
    assert again["kind"] == "book.snapshot" and again["version"] == 1
    await communicator.disconnect()


@pytest.mark.parametrize("path", ["/ws/nope/", "/ws/markets/", "/elsewhere", "/ws/markets/a/b/"])
async def test_an_unknown_websocket_path_is_refused_not_a_500(client, world, path) -> None:
    """Issue 30: a handshake to an unknown path raised "No route found" (an HTTP 500)."""
    await sync_to_async(logged_in)(client, world, "operator")
    communicator = WebsocketCommunicator(application, path, headers=session_cookie(client))
    connected, code = await communicator.connect(timeout=5)
    assert (connected, code) == (False, 4404)
