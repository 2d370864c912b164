"""Pushing a market's reserve and policy to its engine: after commit, from the next round, with
retries while the engine is away, and never an error in the operator's request."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from django.db import transaction

from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
from market.engine_control import engine_config_push, retry_delay_s
from market.models import ControlChange, Market
from market.services import market_policy_set, market_reserve_set
from market.tasks import engine_config_push as push_task
from tests.accounts.factories import market_create
from tests.conftest import ENGINE_ADMIN_TOKEN, dead_port
from tests.scheduler_bridge.workers import celery_worker, wait_until

SPEED = 50.0


@pytest.fixture
def sim() -> Iterator[ServerThread]:
    with ServerThread(
        ServerOptions.of(port=0, speed=SPEED, admin_token=ENGINE_ADMIN_TOKEN, market="test-llm")
    ) as server:
        yield server


def engine_url_set(market: Market, url: str) -> None:
    Market.objects.filter(pk=market.pk).update(engine_url=url)
    market.refresh_from_db()


def generate(url: str, rid: str, bid: float) -> None:
    body = {
        "rid": rid,
        "text": f"request {rid}",
        "sampling_params": {"max_new_tokens": 1, "custom_params": {"bid": bid}},
    }
    assert httpx.post(f"{url}/generate", json=body, timeout=30).status_code == 200


def engine_state(sim: ServerThread) -> tuple[str, float]:
    return sim.call(lambda: (sim.server.engine.policy, sim.server.engine.reserve))


@pytest.mark.django_db
def test_a_reserve_change_reaches_the_engine_from_its_next_round(
    sim: ServerThread, eager, django_capture_on_commit_callbacks
) -> None:
    market = market_create()
    engine_url_set(market, sim.url)
    records: list[dict] = []
    lock = threading.Lock()

    def keep(record: dict) -> None:
        with lock:
            records.append(record)

    sim.call(lambda: sim.server.callbacks.callbacks.append(keep))
    generate(sim.url, "before", 0.001)
    with django_capture_on_commit_callbacks(execute=False) as queued:
        change = market_reserve_set(market=market, reserve="0.002", user=None)
    assert change is not None and len(queued) == 1
    assert engine_state(sim)[1] == 0.0  # nothing is sent before the change commits
    queued[0]()  # the commit
    assert engine_state(sim) == ("dfs-auction-kv-split", 0.002)
    generate(sim.url, "after", 0.001)
    by_request = {a["request_id"]: (r, a) for r in records for a in r["admitted"]}
    before, after = by_request["before"], by_request["after"]
    assert before[0]["reserve"] == 0.0 and before[1]["effective_bid"] == 0.001
    # A bid of 0.001 $/s is now under the 0.002 reserve: it buys no priority.
    assert after[0]["reserve"] == 0.002 and after[1]["effective_bid"] == 0.0


@pytest.mark.django_db
def test_a_policy_change_is_validated_logged_and_pushed(
    sim: ServerThread, eager, django_capture_on_commit_callbacks, caplog
) -> None:
    market = market_create()
    engine_url_set(market, sim.url)
    with pytest.raises(ValueError, match="unknown policy"):
        market_policy_set(market=market, policy="cheapest-first", user=None)
    with django_capture_on_commit_callbacks(execute=True) as queued:
        assert market_policy_set(market=market, policy="lpm", user=None) == "dfs-auction-kv-split"
        assert market_policy_set(market=market, policy="lpm", user=None) is None  # no change
    assert len(queued) == 1
    assert Market.objects.get(pk=market.pk).policy == "lpm"
    assert engine_state(sim) == ("lpm", 0.0)
    assert "market test-llm: policy dfs-auction-kv-split -> lpm by system" in caplog.text


@pytest.mark.django_db
@pytest.mark.parametrize("policy", ["lpm", "dfs-auction-density", "dfs-auction-kv-split"])
def test_each_offered_policy_is_chosen_by_name_and_reaches_the_engine(
    sim: ServerThread, eager, django_capture_on_commit_callbacks, policy
) -> None:
    market = market_create()
    engine_url_set(market, sim.url)
    start = "lpm" if policy != "lpm" else "dfs-auction-density"
    Market.objects.filter(pk=market.pk).update(policy=start)
    market.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        assert market_policy_set(market=market, policy=policy, user=None) == start
    assert Market.objects.get(pk=market.pk).policy == policy
    assert engine_state(sim) == (policy, 0.0)


@pytest.mark.django_db
@pytest.mark.parametrize("baseline", ["fcfs", "highest-bid", "dfs-auction-kv"])
def test_a_benchmark_baseline_is_refused_and_nothing_changes(baseline) -> None:
    market = market_create()
    with pytest.raises(ValueError, match="not offered for a market"):
        market_policy_set(market=market, policy=baseline, user=None)
    assert Market.objects.get(pk=market.pk).policy == "dfs-auction-kv-split"
    assert not ControlChange.objects.exists()


@pytest.mark.django_db
def test_nothing_is_pushed_when_the_change_rolls_back(django_capture_on_commit_callbacks) -> None:
    market = market_create()
    with django_capture_on_commit_callbacks(execute=False) as queued:
        with pytest.raises(RuntimeError), transaction.atomic():
            market_reserve_set(market=market, reserve="0.5", user=None)
            raise RuntimeError("the operator's request failed later")
    assert queued == []
    assert Market.objects.get(pk=market.pk).reserve == Decimal("0")


@pytest.mark.django_db
def test_an_engine_that_is_down_never_fails_the_operators_change(
    django_capture_on_commit_callbacks,
) -> None:
    market = market_create()
    engine_url_set(market, f"http://127.0.0.1:{dead_port()}")
    with django_capture_on_commit_callbacks(execute=True):  # the push is queued for a worker
        assert market_reserve_set(market=market, reserve="0.25", user=None) is not None
    assert Market.objects.get(pk=market.pk).reserve == Decimal("0.25")


@pytest.mark.django_db
def test_pushes_that_cannot_happen_say_why() -> None:
    market = market_create()
    engine_url_set(market, "")
    assert engine_config_push(market_id=market.pk) == "no-engine"
    assert engine_config_push(market_id=market.pk + 1000) == "no-market"


@pytest.mark.django_db
def test_the_admin_token_is_sent(settings) -> None:
    market = market_create()
    Market.objects.filter(pk=market.pk).update(reserve=Decimal("0.5"), policy="fcfs")
    with ServerThread(ServerOptions.of(port=0, speed=SPEED, admin_token="s3cret")) as sim:
        engine_url_set(market, sim.url)
        settings.ENGINE_ADMIN_TOKEN = "wrong"
        assert engine_config_push(market_id=market.pk) == "refused"  # 401: no retry helps
        assert engine_state(sim) == ("dfs-auction-kv-split", 0.0)
        settings.ENGINE_ADMIN_TOKEN = "s3cret"
        assert engine_config_push(market_id=market.pk) == "pushed"
        assert engine_state(sim) == ("fcfs", 0.5)


def test_retries_back_off() -> None:
    assert [retry_delay_s(n) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_retries_until_the_engine_comes_up(tmp_path: Path) -> None:
    market = market_create()
    Market.objects.filter(pk=market.pk).update(reserve=Decimal("0.125"), policy="fcfs")
    port = dead_port()
    engine_url_set(market, f"http://127.0.0.1:{port}")
    with celery_worker(tmp_path) as worker:
        result = push_task.apply_async(kwargs={"market_id": market.pk}, queue=worker.queue)
        # Tries at 0 s and 1 s fail (connection refused); the next one comes 2 s later.
        wait_until(lambda: worker.log.read_text().count("retrying in") >= 2, what="two retries")
        with ServerThread(
            ServerOptions.of(port=port, speed=SPEED, admin_token=ENGINE_ADMIN_TOKEN)
        ) as sim:
            assert result.get(timeout=60) == "pushed"
            assert engine_state(sim) == ("fcfs", 0.125)
    assert "retrying in 1 s" in worker.log.read_text()
    assert "retrying in 2 s" in worker.log.read_text()
