"""The console's reserve what-if: the recorded queues kept an hour per market (Django's cache,
Redis under ``REDIS_URL``), cleared again at a range of reserves; the JSON the console polls,
for operators only. The rounds are a simulated engine's, recorded at a reserve of 0.003 $/s."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.core.cache import cache

from engines.contract.knobs import MarketKnobs
from engines.contract.records import round_record_dumps, round_record_loads
from engines.sim import Engine, EngineConfig
from engines.sim.driver import ArrivalQueue, run_virtual
from market.live import whatif
from market.live.publisher import RoundsPublisher
from tests.engines.contract.test_whatif_record import workload
from tests.personas import PERSONAS, logged_in, world_create

RESERVE = 0.003
SLUG = "test-llm"


@pytest.fixture(scope="module")
def records() -> list[dict]:
    config = EngineConfig(prefill_token_s=1e-3, max_prefill_tokens=256, chunked_prefill_size=256)
    engine = Engine(config, knobs=MarketKnobs(market=SLUG, reserve=RESERVE, book_interval_s=0.0))
    engine.recorder.queue_interval_s = 0.0  # a queue in every record
    got: list[dict] = []
    run_virtual(
        engine, ArrivalQueue(workload(11)), on_step=lambda s: s.record and got.append(s.record)
    )
    return [round_record_loads(round_record_dumps(r)) for r in got if r["waiting"] > 1]


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    whatif.whatif_clear(SLUG)
    yield
    whatif.whatif_clear(SLUG)


def keep_all(records: list[dict], *, now: float) -> None:
    """Keep every record, as if each came ``KEEP_INTERVAL_S`` after the one before."""
    for i, r in enumerate(records):
        cache.delete(f"live:whatif:{SLUG}:gate")
        assert whatif.whatif_keep(r, now=now - (len(records) - i) * whatif.KEEP_INTERVAL_S)


def test_one_queue_is_kept_per_interval_and_the_window_is_an_hour(records) -> None:
    first, second = records[:2]
    assert whatif.whatif_keep(first, now=1000.0)
    assert not whatif.whatif_keep(second, now=1001.0)  # within the interval: left out
    assert [k["round_id"] for k in whatif.whatif_rounds(SLUG, now=1000.0 + 60)] == [
        first["round_id"]
    ]
    assert whatif.whatif_rounds(SLUG, now=1000.0 + whatif.WINDOW_S + 1) == []  # an hour later


def test_a_record_without_a_queue_is_not_kept(records) -> None:
    bare = {k: v for k, v in records[0].items() if k != "queue"}
    assert not whatif.whatif_keep(bare)
    assert whatif.whatif_rounds(SLUG) == []


def test_the_publisher_keeps_the_queue_of_the_records_it_takes(records, db) -> None:
    RoundsPublisher().settled(records[0])
    assert [k["round_id"] for k in whatif.whatif_rounds(SLUG)] == [records[0]["round_id"]]


def test_at_the_current_reserve_the_what_if_is_the_recorded_revenue(records) -> None:
    now = 10_000.0
    kept = records[: whatif.SAMPLE]
    keep_all(kept, now=now)
    w = whatif.whatif_compute(SLUG, current=RESERVE, now=now)
    assert (w["rounds"], w["sampled"], w["skipped"]) == (len(kept), len(kept), 0)
    by_reserve = {p["reserve"]: p for p in w["points"]}
    assert 0.0 in by_reserve and RESERVE in by_reserve and len(by_reserve) > 5
    # The recorded revenue per round, from the records themselves.
    recorded = sum(sum(a["charge"] for a in r["admitted"]) for r in kept) / len(kept)
    assert recorded > 0 and w["recorded_at_current"]
    assert w["recorded"] == by_reserve[RESERVE]["revenue"] == pytest.approx(recorded, rel=1e-12)
    # At no reserve every positive bid keeps priority; above the highest, none.
    bids = [b for r in kept for b in r["queue"]["bid"]]
    assert by_reserve[0.0]["priority_share"] == sum(b > 0 for b in bids) / len(bids)
    assert by_reserve[max(bids)]["priority_share"] == sum(b == max(bids) for b in bids) / len(bids)
    reserves = [p["reserve"] for p in w["points"]]
    assert reserves == sorted(reserves)
    # Another current reserve: the recorded revenue is no longer at it.
    assert not whatif.whatif_compute(SLUG, current=0.01, now=now)["recorded_at_current"]


def test_many_rounds_are_sampled(records) -> None:
    assert len(records) > whatif.SAMPLE
    keep_all(records, now=20_000.0)
    w = whatif.whatif_compute(SLUG, current=RESERVE, now=20_000.0)
    assert (w["rounds"], w["sampled"]) == (len(records), whatif.SAMPLE)


def test_no_recorded_round_gives_no_points(db) -> None:
    w = whatif.whatif_for_market(SLUG, current=RESERVE)
    assert (w["rounds"], w["points"], w["recorded"]) == (0, [], None)


@pytest.mark.django_db
@pytest.mark.parametrize("persona", PERSONAS)
def test_the_what_if_is_for_operators(client, persona, records) -> None:
    world = world_create()
    keep_all(records[:3], now=time.time())
    logged_in(client, world, persona)
    response = client.get(f"/console/markets/{SLUG}/reserve/whatif/")
    if persona == "operator":
        assert response.status_code == 200
        body = response.json()
        assert body["rounds"] == 3 and body["current"] == 0.0 and body["points"]
    elif persona == "anonymous":
        assert response.status_code == 302
    else:
        assert response.status_code == 403
