"""The market's control store: an operator's policy and reserve reach engines that follow the
store (SGLang's plugin, a simulated engine with ``--follow-control``) as they reach an engine
with an HTTP control path, and an engine without that route is not reported as refusing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engines.contract.control import (
    RedisControlStore,
    control_loads,
    now_state,
)
from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
from market.engine_control import engine_config_push
from market.models import Market
from market.services import market_policy_set, market_reserve_set, market_wait_bound_set
from tests.accounts.factories import market_create
from tests.market.test_engine_control import engine_state, engine_url_set
from tests.scheduler_bridge.workers import wait_until


class NoControlRoute(BaseHTTPRequestHandler):
    """An engine as SGLang is: no route for the market's control (404)."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"detail": "Not Found"}'
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def sglang_like() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), NoControlRoute)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def stored(settings, slug: str):
    store = RedisControlStore(settings.REDIS_URL, slug)
    text = store.read()
    return None if text is None else control_loads(text)


@pytest.mark.django_db
def test_an_engine_without_a_control_route_gets_the_change_through_the_store(
    settings, sglang_like, eager, django_capture_on_commit_callbacks
) -> None:
    market = market_create()
    engine_url_set(market, sglang_like)
    with django_capture_on_commit_callbacks(execute=True):
        assert market_reserve_set(market=market, reserve="0.125", user=None) is not None
    state = stored(settings, market.slug)
    assert (state.policy, state.reserve) == (market.policy, 0.125)
    assert engine_config_push(market_id=market.pk) == "published"  # 404, not "refused"


@pytest.mark.django_db
def test_a_market_without_engines_still_has_its_state_in_the_store(settings) -> None:
    market = market_create()
    Market.objects.filter(pk=market.pk).update(policy="highest-bid", reserve="0.5")
    engine_url_set(market, "")
    assert engine_config_push(market_id=market.pk) == "no-engine"
    state = stored(settings, market.slug)
    assert (state.policy, state.reserve) == ("highest-bid", 0.5)


@pytest.mark.django_db
def test_a_simulated_engine_following_the_store_runs_the_console_values(
    settings, eager, django_capture_on_commit_callbacks
) -> None:
    market = market_create()
    engine_url_set(market, "")  # no push at all: only the store carries the change
    RedisControlStore(settings.REDIS_URL, market.slug).write(now_state("fcfs", 0.25))
    options = ServerOptions.of(
        port=0, speed=50, market=market.slug, redis_url=settings.REDIS_URL, follow_control=True
    )
    with ServerThread(options) as sim:
        # What the store held when the engine started is in effect from its first round.
        assert sim_round(sim)
        assert engine_state(sim) == ("fcfs", 0.25)
        with django_capture_on_commit_callbacks(execute=True):
            market_policy_set(market=market, policy="dfs-auction-density", user=None)
            market_reserve_set(market=market, reserve="0.0625", user=None)
        wait_until(
            lambda: sim_round(sim) and engine_state(sim) == ("dfs-auction-density", 0.0625),
            what="the engine to apply the console's change",
        )
        # The wait bound travels the same way, with the policy and reserve kept: the market's
        # automatic 20 s went with them.
        assert sim.call(lambda: sim.server.engine.knobs.wait_bound_s) == 20.0
        with django_capture_on_commit_callbacks(execute=True):
            market_wait_bound_set(market=market, wait_bound_s=30, user=None)
        assert stored(settings, market.slug).wait_bound_s == 30.0
        wait_until(
            lambda: sim_round(sim) and sim.call(lambda: sim.server.engine.knobs.wait_bound_s) == 30,
            what="the engine to apply the console's wait bound",
        )
        assert engine_state(sim) == ("dfs-auction-density", 0.0625)


def sim_round(sim: ServerThread) -> bool:
    """Give the engine a round to run (a change applies at a round's start)."""
    import httpx

    body = {"text": "tick", "sampling_params": {"max_new_tokens": 1}}
    return httpx.post(f"{sim.url}/generate", json=body, timeout=30).status_code == 200
