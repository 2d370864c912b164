"""The gateway in front of SGLang's real model gateway (smg) in front of simulated replicas: the
tenant's bid arrives and is reported back, the console's reserve reaches every replica behind
smg, and smg with no replica left (its first answer a 500, then 503s) is the gateway's 503
``engine_unavailable`` with the hold released and nothing charged."""

from __future__ import annotations

from decimal import Decimal

import pytest

from market.services import market_reserve_set, replica_set
from tests.engines.router.test_router import replicas, router
from tests.market.test_engine_control import engine_state
from tests.openai_api.conftest import market_create
from tests.openai_api.gateway.test_engine_timeouts import (
    assert_failed_uncharged,
    chat_body,
    only_request_id,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_bid_through_smg_is_the_bid_the_replica_read(gateway, acme):
    with replicas("g1", "g2") as reps, router(reps) as front:
        market = market_create(engine_url=front.url)
        with acme.http(gateway) as http:
            response = http.post(
                "/v1/chat/completions", json=chat_body(market, bid=0.375), timeout=30
            )
    assert response.status_code == 200, response.text
    auction = response.json()["auction"]
    assert Decimal(auction["bid"]) == Decimal("0.375")
    assert auction["round_id"]  # the replica priced it in-band
    assert sum(len(r.served()) for r in reps) == 1


def test_the_reserve_reaches_every_replica_behind_smg(
    gateway, acme, eager, django_capture_on_commit_callbacks
):
    with replicas("r1", "r2") as reps, router(reps, "round_robin") as front:
        market = market_create(engine_url=front.url)
        with django_capture_on_commit_callbacks(execute=True):
            for r in reps:
                replica_set(market=market, engine_id=r.engine_id, url=r.url)
            market_reserve_set(market=market, reserve="0.5", user=None)
        assert [engine_state(r.thread)[1] for r in reps] == [0.5, 0.5]
        with acme.http(gateway) as http:
            for _ in range(2):  # round robin: one on each replica
                response = http.post(
                    "/v1/chat/completions", json=chat_body(market, bid=0.25), timeout=30
                )
                assert response.status_code == 200, response.text
    records = [a for r in reps for rec in r.records for a in rec["admitted"]]
    # A bid of 0.25 $/s under the 0.5 reserve buys no priority, on either replica.
    assert len(records) == 2 and all(a["effective_bid"] == 0.0 for a in records)
    assert all(len(r.served()) == 1 for r in reps)


@pytest.mark.parametrize("stream", [False, True])
def test_smg_without_a_live_replica_is_a_503_and_nothing_is_charged(gateway, acme, stream):
    with replicas("d1") as (only,), router([only]) as front:
        market = market_create(engine_url=front.url)
        only.stop()
        with acme.http(gateway) as http:
            response = http.post(
                "/v1/chat/completions", json=chat_body(market, stream=stream), timeout=30
            )
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "engine_unavailable"
    assert_failed_uncharged(only_request_id())
