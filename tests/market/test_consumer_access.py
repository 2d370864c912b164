"""Open websockets lose their access when their user does (issue 12, finding 8).

A socket is checked when it connects, and again while it is open: at once when the user's
membership or the user changes or the user logs out (``market.live.access``), and every
``LIVE_ACCESS_RECHECK_S`` for what sends no signal. Once access is gone the socket is closed with
4403 and receives nothing more. The event-driven tests set the periodic re-check to a minute, so
only the event can close the socket in time; the periodic ones make changes that send no signal.
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.test import Client

from accounts.models import Membership, Role
from config.asgi import application
from market.consumers import FORBIDDEN
from market.live.send import group_send
from market.live.spend import spend_ticks_publish
from market.payloads import RoundResult, market_group
from tests.market.live_helpers import session_cookie
from tests.personas import World, logged_in, world_create

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

CLOSE_WITHIN_S = 2.0  # an event closes a socket at once; this is only slack for slow machines


@pytest.fixture
def world(unique_slug) -> World:
    return world_create(market_slug=unique_slug)


@pytest.fixture
def event_driven(settings):
    """The periodic re-check far away: only an event can close a socket within the test."""
    settings.LIVE_ACCESS_RECHECK_S = 60.0


async def socket_as(world: World, persona: str, path: str, client: Client | None = None):
    """A connected socket of ``persona`` (with a session of its own unless ``client`` is
    given), and the client holding that session."""
    client = client or Client()
    await sync_to_async(logged_in)(client, world, persona)
    communicator = WebsocketCommunicator(application, path, headers=session_cookie(client))
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    return communicator, client


async def tick_to_acme(world: World) -> None:
    await sync_to_async(spend_ticks_publish)(requests_by_tenant={world.a.pk: []})


async def assert_receives_a_tick(communicator: WebsocketCommunicator, world: World) -> None:
    await tick_to_acme(world)
    tick = await communicator.receive_json_from(timeout=5)
    assert (tick["kind"], tick["tenant"]) == ("spend.tick", "acme")


async def assert_closed_forbidden(communicator: WebsocketCommunicator, timeout_s: float) -> None:
    """The next thing the socket gets is a close with 4403, within ``timeout_s``."""
    try:
        output = await communicator.receive_output(timeout=timeout_s)
    except TimeoutError:
        pytest.fail(f"the socket was still open after {timeout_s} s")
    assert output == {"type": "websocket.close", "code": FORBIDDEN}


async def assert_nothing_more(communicator: WebsocketCommunicator, world: World) -> None:
    await tick_to_acme(world)
    await sync_to_async(group_send)(market_group(world.market.slug), round_result(world))
    assert await communicator.receive_nothing(timeout=0.5)
    await communicator.disconnect()


def round_result(world: World) -> RoundResult:
    return {
        "kind": "round.result", "market": world.market.slug, "at": 1.0, "round_id": "e:1:1",
        "rounds": 1, "admitted": 1, "revenue": 0.0, "welfare": 0.0, "waiting": 0,
        "policy": "fcfs", "reserve": 0.0,
    }  # fmt: skip


def _save(user, **fields) -> None:
    for name, value in fields.items():
        setattr(user, name, value)
    user.save()


# --- at once, on the change ------------------------------------------------------------------


async def test_deleting_the_membership_closes_the_tenant_socket_at_once(world, event_driven):
    viewer, _ = await socket_as(world, "a_viewer", "/ws/tenants/acme/")
    await assert_receives_a_tick(viewer, world)
    user = world.users["a_viewer"]
    await sync_to_async(Membership.objects.filter(user=user, tenant=world.a).delete)()
    await assert_closed_forbidden(viewer, CLOSE_WITHIN_S)
    await assert_nothing_more(viewer, world)


@pytest.mark.parametrize(
    ("persona", "path"),
    [("a_viewer", "/ws/tenants/acme/"), ("operator", "/ws/markets/{market}/")],
)
async def test_deactivating_the_user_closes_its_sockets_at_once(world, event_driven, persona, path):
    communicator, _ = await socket_as(world, persona, path.format(market=world.market.slug))
    await sync_to_async(_save)(world.users[persona], is_active=False)
    await assert_closed_forbidden(communicator, CLOSE_WITHIN_S)
    await assert_nothing_more(communicator, world)


async def test_losing_staff_closes_the_operators_sockets_at_once(world, event_driven):
    console, _ = await socket_as(world, "operator", f"/ws/markets/{world.market.slug}/")
    tenant_page, _ = await socket_as(world, "operator", "/ws/tenants/acme/")
    await sync_to_async(group_send)(market_group(world.market.slug), round_result(world))
    assert (await console.receive_json_from(timeout=5))["kind"] == "round.result"
    await sync_to_async(_save)(world.users["operator"], is_staff=False)
    await assert_closed_forbidden(console, CLOSE_WITHIN_S)
    await assert_closed_forbidden(tenant_page, CLOSE_WITHIN_S)  # not a member of acme either
    await assert_nothing_more(console, world)
    await assert_nothing_more(tenant_page, world)


async def test_logging_out_closes_that_sessions_sockets_and_no_other(world, event_driven):
    left, leaving = await socket_as(world, "a_viewer", "/ws/tenants/acme/")
    stays, _ = await socket_as(world, "a_viewer", "/ws/tenants/acme/")  # another browser
    await sync_to_async(leaving.logout)()
    await assert_closed_forbidden(left, CLOSE_WITHIN_S)
    await assert_nothing_more(left, world)
    await assert_receives_a_tick(stays, world)
    await stays.disconnect()


async def test_changes_to_others_leave_a_socket_open(world, event_driven):
    viewer, _ = await socket_as(world, "a_viewer", "/ws/tenants/acme/")
    admin = world.users["a_admin"]
    await sync_to_async(Membership.objects.filter(user=admin).delete)()
    await sync_to_async(_save)(world.users["b_admin"], is_active=False)
    membership = await sync_to_async(Membership.objects.get)(user=world.users["a_viewer"])
    await sync_to_async(_save)(membership, role=Role.ADMIN)  # still a member, with more rights
    elsewhere = Client()
    await sync_to_async(logged_in)(elsewhere, world, "a_viewer")  # a login in another browser
    await sync_to_async(elsewhere.logout)()  # ... and its logout: that session only
    await assert_receives_a_tick(viewer, world)
    await viewer.disconnect()


# --- the periodic re-check, for changes that send no signal --------------------------------


def _deactivate_quietly(world: World) -> None:
    get_user_model().objects.filter(pk=world.users["a_viewer"].pk).update(is_active=False)


def _end_sessions_quietly(world: World) -> None:
    Session.objects.all().delete()  # as `clearsessions` or a session store flush would


def _move_quietly(world: World) -> None:
    Membership.objects.filter(user=world.users["a_viewer"]).update(tenant=world.b)


@pytest.mark.parametrize("change", [_deactivate_quietly, _end_sessions_quietly, _move_quietly])
async def test_the_periodic_recheck_closes_a_socket_whose_access_ended_quietly(
    world, settings, change
):
    settings.LIVE_ACCESS_RECHECK_S = 0.3
    viewer, _ = await socket_as(world, "a_viewer", "/ws/tenants/acme/")
    await assert_receives_a_tick(viewer, world)
    await sync_to_async(change)(world)
    await assert_closed_forbidden(viewer, 0.3 + CLOSE_WITHIN_S)
    await assert_nothing_more(viewer, world)


async def test_the_periodic_recheck_keeps_a_socket_whose_access_holds(world, settings):
    settings.LIVE_ACCESS_RECHECK_S = 0.1
    viewer, _ = await socket_as(world, "a_viewer", "/ws/tenants/acme/")
    assert await viewer.receive_nothing(timeout=0.6)  # several re-checks, all passed
    await assert_receives_a_tick(viewer, world)
    await viewer.disconnect()
