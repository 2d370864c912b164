"""The periodic tick writes a market's control store back when it is found missing or older than
the market's last change: a value pushed to one engine's own control path does not outlive a
Redis that lost its data by more than a tick and a follower's poll."""

from __future__ import annotations

import time
from decimal import Decimal

import httpx
import pytest
import redis

from engines.contract.control import (
    DEFAULT_POLL_S,
    ControlState,
    RedisControlStore,
    control_key,
    control_loads,
    now_state,
)
from market.engine_control import control_publish, controls_refresh
from market.live.periodic import live_tick
from market.models import Market
from market.services import market_reserve_set
from tests.accounts.factories import market_create
from tests.conftest import ENGINE_ADMIN_TOKEN, dead_port
from tests.market.test_control_store import sim_round
from tests.market.test_engine_control import engine_url_set
from tests.scheduler_bridge.workers import wait_until

pytestmark = pytest.mark.django_db

MARKETS = ("dfs-auction-density", 0.001, 30.0)  # the market's policy, reserve, wait bound
OVERRIDE = {"policy": "fcfs", "reserve": 0.5, "wait_bound_s": 0}


def stored(settings, slug: str) -> ControlState | None:
    store = RedisControlStore(settings.REDIS_URL, slug)
    try:
        text = store.read()
    finally:
        store.close()
    return None if text is None else control_loads(text)


def engine_values(url: str) -> tuple[str, float, float]:
    info = httpx.get(f"{url}/get_model_info", timeout=10).json()
    return info["policy"], info["reserve"], info["wait_bound_s"]


def test_a_local_override_does_not_outlive_a_redis_that_lost_the_store(
    settings, unique_slug, start_sim
) -> None:
    market = market_create(unique_slug)
    policy, reserve, wait_bound_s = MARKETS
    Market.objects.filter(pk=market.pk).update(
        policy=policy, reserve=Decimal(str(reserve)), wait_bound_s=wait_bound_s
    )
    market.refresh_from_db()
    control_publish(market)  # as live_market does at start
    sim = start_sim(market=unique_slug, redis_url=settings.REDIS_URL, follow_control=True)
    engine_url_set(market, sim.url)  # the tick polls it as it polls any market's engine
    assert sim_round(sim) and engine_values(sim.url) == MARKETS
    # Redis restarted empty: the market's key is gone.
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert client.delete(control_key(unique_slug)) == 1
    client.close()
    auth = {"Authorization": f"Bearer {ENGINE_ADMIN_TOKEN}"}
    pushed = httpx.post(f"{sim.url}/admin/market", json=OVERRIDE, headers=auth, timeout=10)
    assert pushed.status_code == 200
    # With nothing in the store the follower keeps the override, poll after poll.
    time.sleep(3 * DEFAULT_POLL_S)
    assert sim_round(sim) and engine_values(sim.url) == ("fcfs", 0.5, 0.0)
    tick = live_tick()  # as celery beat runs it, every second
    ticked = time.monotonic()
    wait_until(
        lambda: sim_round(sim) and engine_values(sim.url) == MARKETS,
        timeout_s=DEFAULT_POLL_S + 1.5,  # a poll, a round, and room for a loaded machine
        what="the engine to be back on the market's values after one tick",
    )
    back_s = time.monotonic() - ticked
    assert tick.controls_written == 1 and tick.markets == 1 and tick.engines_up == 1
    assert stored(settings, unique_slug) == now_state(policy, reserve, wait_bound_s)
    print(f"back on the market's values {back_s:.2f} s after the tick")


def test_a_store_older_than_the_market_is_written_again_and_a_current_one_is_left(
    settings, unique_slug
) -> None:
    market = market_create(unique_slug)
    engine_url_set(market, "")  # no engine: the store is all there is
    # Nothing there (a market never published): written.
    assert stored(settings, unique_slug) is None
    tick = live_tick()
    first = stored(settings, unique_slug)
    assert first is not None and (first.policy, first.reserve) == (market.policy, 0.0)
    assert tick.controls_written == 1
    # Current: the next ticks write nothing.
    assert live_tick().controls_written == 0 and live_tick().controls_written == 0
    assert stored(settings, unique_slug).written_at == first.written_at
    # A change whose push never ran (its on-commit callback is not run here): the store is
    # older than the market (``Market.updated_at``), and the tick writes the new reserve.
    assert market_reserve_set(market=market, reserve="0.25", user=None) is not None
    market.refresh_from_db()
    assert stored(settings, unique_slug).written_at < market.updated_at.timestamp()
    assert live_tick().controls_written == 1
    second = stored(settings, unique_slug)
    assert second.reserve == 0.25 and second.written_at >= market.updated_at.timestamp()
    assert live_tick().controls_written == 0
    assert stored(settings, unique_slug).written_at == second.written_at
    # A state written since the market's last change is current, whatever it holds (the
    # market's own push writes what the database says when it runs).
    RedisControlStore(settings.REDIS_URL, unique_slug).write(now_state("fcfs", 0.125))
    assert live_tick().controls_written == 0
    assert stored(settings, unique_slug) == now_state("fcfs", 0.125)
    # A state no engine can use is no state: written.
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.set(control_key(unique_slug), b"{not json")
    client.close()
    assert live_tick().controls_written == 1
    assert stored(settings, unique_slug) == now_state(market.policy, 0.25, market.wait_bound_s)


def test_a_store_that_cannot_be_reached_is_left_to_the_next_tick(settings, unique_slug) -> None:
    market = market_create(unique_slug)
    engine_url_set(market, "")
    settings.REDIS_URL = f"redis://127.0.0.1:{dead_port()}/0"
    assert controls_refresh([market]) == [] and controls_refresh([market]) == []  # no raise
    assert live_tick().controls_written == 0
