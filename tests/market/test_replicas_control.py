"""A market of several replicas: the console's policy and reserve reach every enabled replica,
and a replica that is away is retried on its own, without pushing the others again."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
from market.engine_control import control_targets, engine_config_push
from market.models import Market, Replica
from market.services import market_reserve_set, replica_set
from market.tasks import engine_config_push as push_task
from tests.accounts.factories import market_create
from tests.conftest import ENGINE_ADMIN_TOKEN, dead_port
from tests.market.test_engine_control import SPEED, engine_state, engine_url_set
from tests.scheduler_bridge.workers import celery_worker, wait_until


@pytest.fixture
def two_sims() -> Iterator[tuple[ServerThread, ServerThread]]:
    with (
        ServerThread(
            ServerOptions.of(port=0, speed=SPEED, admin_token=ENGINE_ADMIN_TOKEN, engine_id="rep-a")
        ) as a,
        ServerThread(
            ServerOptions.of(port=0, speed=SPEED, admin_token=ENGINE_ADMIN_TOKEN, engine_id="rep-b")
        ) as b,
    ):
        yield a, b


@pytest.mark.django_db
def test_the_targets_are_the_enabled_replicas_else_the_entry_point() -> None:
    market = market_create()
    engine_url_set(market, "http://router:30000")
    assert control_targets(market) == ["http://router:30000"]
    replica_set(market=market, engine_id="a", url="http://a:1/")
    replica_set(market=market, engine_id="b", url="http://b:1", enabled=False)
    assert control_targets(market) == ["http://a:1"]  # trailing slash gone; b is disabled
    replica_set(market=market, engine_id="a", url="http://a:1", enabled=False)
    assert control_targets(market) == []  # replicas, all disabled: nothing (not the router)
    other = market_create(slug="other")
    with pytest.raises(ValueError, match="another market"):
        replica_set(market=other, engine_id="a", url="http://a:2")
    with pytest.raises(ValueError, match="engine id and a URL"):
        replica_set(market=other, engine_id=" ", url="http://a:2")


@pytest.mark.django_db
def test_a_reserve_change_reaches_every_replica(
    two_sims, eager, django_capture_on_commit_callbacks
) -> None:
    a, b = two_sims
    market = market_create()
    engine_url_set(market, "http://127.0.0.1:9")  # the router: never pushed to
    with django_capture_on_commit_callbacks(execute=True):
        replica_set(market=market, engine_id="rep-a", url=a.url)
        replica_set(market=market, engine_id="rep-b", url=b.url)
        market_reserve_set(market=market, reserve="0.25", user=None)
    assert engine_state(a) == engine_state(b) == ("dfs-auction-kv-split", 0.25)


@pytest.mark.django_db
def test_a_new_replica_gets_the_current_values(
    two_sims, eager, django_capture_on_commit_callbacks
) -> None:
    a, b = two_sims
    market = market_create()
    Market.objects.filter(pk=market.pk).update(reserve=Decimal("0.5"), policy="fcfs")
    with django_capture_on_commit_callbacks(execute=True):
        replica_set(market=market, engine_id="rep-a", url=a.url)
    assert engine_state(a) == ("fcfs", 0.5)
    assert engine_state(b) == ("dfs-auction-kv-split", 0.0)  # not a replica yet


@pytest.mark.django_db
def test_one_replica_away_is_named_and_the_others_are_pushed(two_sims) -> None:
    a, _ = two_sims
    market = market_create()
    Market.objects.filter(pk=market.pk).update(reserve=Decimal("0.125"))
    away = f"http://127.0.0.1:{dead_port()}"
    Replica.objects.create(market=market, engine_id="rep-a", url=a.url)
    Replica.objects.create(market=market, engine_id="rep-away", url=away)
    with pytest.raises(Exception) as caught:
        engine_config_push(market_id=market.pk)
    assert caught.value.urls == (away,)
    assert engine_state(a)[1] == 0.125


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_retries_the_replica_that_is_away_and_only_it(tmp_path: Path) -> None:
    with ServerThread(
        ServerOptions.of(port=0, speed=SPEED, admin_token=ENGINE_ADMIN_TOKEN, engine_id="rep-a")
    ) as a:
        market = market_create()
        Market.objects.filter(pk=market.pk).update(reserve=Decimal("0.125"), policy="fcfs")
        port = dead_port()
        Replica.objects.create(market=market, engine_id="rep-a", url=a.url)
        Replica.objects.create(market=market, engine_id="rep-b", url=f"http://127.0.0.1:{port}")
        with celery_worker(tmp_path) as worker:
            result = push_task.apply_async(kwargs={"market_id": market.pk}, queue=worker.queue)
            wait_until(lambda: engine_state(a) == ("fcfs", 0.125), what="replica a pushed")
            # Move a away from the market's values: a retry that pushed a again would undo it.
            a.call(lambda: a.server.engine.set_reserve(0.75))
            wait_until(lambda: worker.log.read_text().count("retrying in") >= 2, what="retries")
            with ServerThread(
                ServerOptions.of(
                    port=port, speed=SPEED, admin_token=ENGINE_ADMIN_TOKEN, engine_id="rep-b"
                )
            ) as b:
                assert result.get(timeout=60) == "pushed"
                assert engine_state(b) == ("fcfs", 0.125)
            assert engine_state(a) == ("fcfs", 0.75)  # pushed once, not again
    assert f"127.0.0.1:{port}" in worker.log.read_text()
