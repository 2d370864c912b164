"""A bid lost between the gateway and the engine (a router that rebuilt the body, an engine
without the market's plugin) is an error, never a silent bid of 0: the engine reports the bid it
read, the gateway compares it with what it sent, and on a difference fails the request with 502
``engine_bid_lost``, its hold released and nothing charged."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from tests.openai_api.conftest import market_create
from tests.openai_api.fake_engines import bid_dropping_route
from tests.openai_api.gateway.test_engine_timeouts import (
    assert_failed_uncharged,
    chat_body,
    only_request_id,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("stream", [False, True])
def test_a_bid_the_engine_did_not_read_fails_the_request_uncharged(gateway, acme, sim, stream):
    with bid_dropping_route(sim.url) as route:
        market = market_create(engine_url=route.url)
        with acme.http(gateway) as http:
            response = http.post(
                "/v1/chat/completions",
                json=chat_body(market, stream=stream, bid=0.5),
                timeout=30,
            )
        assert route.forwarded == 1
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "engine_bid_lost")
    # The engine read no bid (no custom_params): 0, where the gateway sent 0.5.
    assert "a bid of 0.0 $/s" in error["message"] and "0.5" in error["message"]
    assert "not charged" in error["message"]
    assert_failed_uncharged(only_request_id())


def test_the_same_route_without_a_loss_serves_the_bid(gateway, acme, sim):
    """The control: straight to the engine, the bid arrives and the answer says so."""
    market = market_create(engine_url=sim.url)
    with acme.http(gateway) as http:
        response = http.post("/v1/chat/completions", json=chat_body(market, bid=0.5), timeout=30)
    assert response.status_code == 200, response.text
    assert Decimal(json.loads(response.text)["auction"]["bid"]) == Decimal("0.5")
