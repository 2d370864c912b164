"""Round records from a real Redis stream into the ledger, in this process (``rounds.py``).

Acknowledged only after settlement, malformed records dead-lettered, pending entries of a dead
consumer reclaimed, replays charging nothing, outages leaving everything pending.
"""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import OperationalError

from accounts.models import BudgetCounter, Hold, HoldState
from scheduler_bridge.settlement import stream as rounds
from scheduler_bridge.settlement.stream import StreamConsumer, rounds_consume
from tests.accounts.factories import market_create, tenant_create
from tests.scheduler_bridge.settlement.rounds_helpers import (
    CHARGES,
    CHARGES_TOTAL,
    Streams,
    expected,
    priority_charges,
    records,
    requests_open,
    streams_fixture,
)

pytestmark = [pytest.mark.redis, pytest.mark.django_db]


streams = pytest.fixture(streams_fixture, name="streams")


@pytest.fixture
def opened() -> None:
    market = market_create()
    requests_open(tenant_create("acme"), market)


def consumer(s: Streams, name: str = "alive") -> StreamConsumer:
    return StreamConsumer(client=s.client, stream=s.name, consumer=name)


def drain(s: Streams, name: str = "alive", **kwargs) -> rounds.ConsumeStats:
    kwargs = {"max_seconds": 10, "until_idle": True, "block_ms": 20} | kwargs
    return rounds_consume(sc=consumer(s, name), **kwargs)


def test_records_are_settled_then_acknowledged(streams: Streams, opened) -> None:
    # Written before any consumer group exists: the new group starts at the stream's start.
    for record in records():
        streams.add(record)
    stats = drain(streams)
    assert (stats.read, stats.settled, stats.charged, stats.duplicates, stats.dead) == (
        4,
        4,
        8,
        0,
        0,
    )
    assert priority_charges() == expected(*CHARGES)
    assert sum(priority_charges().values()) == CHARGES_TOTAL
    assert streams.pending() == 0
    # The requests were served before their records came: each hold closed with its priority
    # charge, and the budget counted each charge once.
    assert set(Hold.objects.values_list("state", "remaining")) == {(HoldState.SETTLED, 0)}
    assert BudgetCounter.objects.get(api_key=None).spent_total == CHARGES_TOTAL


def test_a_call_is_bounded_by_max_records(streams: Streams, opened) -> None:
    for record in records():
        streams.add(record)
    first = drain(streams, max_records=3)
    assert (first.read, first.settled) == (3, 3)
    assert priority_charges() == expected("r0", "r1", "r2", "r3", "r4", "r5")
    second = drain(streams)
    assert (second.read, second.charged) == (1, 2)
    assert priority_charges() == expected(*CHARGES)


def test_malformed_records_go_to_the_dead_letter_stream_and_the_rest_are_settled(
    streams: Streams, opened
) -> None:
    good = records()
    bad_schema = dict(good[1], schema="inference-market/round@0")
    negative = dict(good[2], admitted=[dict(good[2]["admitted"][0], charge=-1.0)])
    streams.add(good[0])
    bad_ids = [
        streams.add("{not json"),
        streams.add(b"\xff\xfe not utf-8"),
        streams.add(bad_schema),
        streams.add(negative),
        streams.client.xadd(streams.name, {"something": "else"}),  # no record field
    ]
    streams.add(good[3])
    stats = drain(streams)
    assert (stats.read, stats.settled, stats.dead, stats.charged) == (7, 2, 5, 4)
    assert priority_charges() == expected("r0", "r1", "r6", "r7")
    assert streams.pending() == 0  # the dead ones are acknowledged too: nothing blocks
    dead = streams.client.xrange(streams.dead)
    assert [entry[b"dead_source_id"] for _, entry in dead] == bad_ids
    errors = [entry[b"dead_error"].decode() for _, entry in dead]
    assert "not JSON" in errors[0] and "not JSON" in errors[1]
    assert "unknown schema" in errors[2] and "negative amount" in errors[3]
    assert "no 'record' field" in errors[4]
    assert dead[1][1][b"record"] == b"\xff\xfe not utf-8"  # kept as it came, for inspection


def test_entries_a_dead_consumer_left_pending_are_reclaimed(streams: Streams, opened) -> None:
    for record in records():
        streams.add(record)
    rounds.rounds_group_ensure(sc=consumer(streams))
    # A consumer reads three entries and dies before acknowledging any of them.
    streams.client.xreadgroup("settlement", "dead", {streams.name: ">"}, count=3)
    assert streams.pending() == 3
    # Not idle long enough: another consumer leaves them alone and takes the fourth.
    stats = drain(streams, claim_min_idle_ms=60_000)
    assert (stats.read, stats.reclaimed, stats.charged) == (1, 0, 2)
    assert streams.pending() == 3
    stats = drain(streams, claim_min_idle_ms=0)
    assert (stats.read, stats.reclaimed, stats.charged) == (3, 3, 6)
    assert streams.pending() == 0
    assert priority_charges() == expected(*CHARGES)

    # The dead consumer has nothing pending any more: it is removed once idle long enough.
    def members() -> set[bytes]:
        return {c["name"] for c in streams.client.xinfo_consumers(streams.name, "settlement")}

    assert members() == {b"dead", b"alive"}
    drain(streams, prune_idle_ms=0)
    assert members() == {b"alive"}


def test_replaying_the_whole_stream_charges_nothing_twice(streams: Streams, opened) -> None:
    entries = records()
    for record in entries:
        streams.add(record)
    assert drain(streams).charged == 8
    # A second group reads the same stream from its start; then the same records arrive again.
    replay = rounds_consume(
        sc=StreamConsumer(client=streams.client, stream=streams.name, group="replay"),
        max_seconds=10,
        until_idle=True,
        block_ms=20,
    )
    for record in entries:
        streams.add(record)
    again = drain(streams)
    for stats in (replay, again):
        assert (stats.settled, stats.charged, stats.duplicates) == (4, 0, 8)
    assert sum(priority_charges().values()) == CHARGES_TOTAL


def test_a_database_outage_leaves_the_records_pending(
    streams: Streams, opened, monkeypatch
) -> None:
    for record in records(rounds=2):
        streams.add(record)

    def down(**kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(rounds, "round_record_settle", down)
    stats = drain(streams)
    assert stats.stalled.startswith("OperationalError") and (stats.settled, stats.dead) == (0, 0)
    assert streams.pending() == 2  # read, not acknowledged, not dead-lettered
    monkeypatch.undo()
    stats = drain(streams, claim_min_idle_ms=0)
    assert (stats.reclaimed, stats.settled, stats.charged) == (2, 2, 4)
    assert priority_charges() == expected("r0", "r1", "r2", "r3")


def test_a_record_that_keeps_failing_is_set_aside_after_max_deliveries(
    streams: Streams, opened, monkeypatch
) -> None:
    streams.add(records()[0])
    poison = streams.add(records()[1])
    real = rounds.round_record_settle

    def flaky(*, record):
        if record["round_id"] == "sim:1:1":
            raise RuntimeError("a bug")
        return real(record=record)

    monkeypatch.setattr(rounds, "round_record_settle", flaky)
    first = drain(streams, max_deliveries=3)
    assert (first.settled, first.failed, first.dead) == (1, 1, 0)
    second = drain(streams, max_deliveries=3, claim_min_idle_ms=0)  # delivery 2
    assert (second.reclaimed, second.failed, second.dead) == (1, 1, 0)
    third = drain(streams, max_deliveries=3, claim_min_idle_ms=0)  # delivery 3: set aside
    assert (third.reclaimed, third.failed, third.dead) == (1, 0, 1)
    assert streams.pending() == 0
    ((_, dead),) = streams.client.xrange(streams.dead)
    assert dead[b"dead_source_id"] == poison
    assert dead[b"dead_error"].startswith(b"failed 3 times, last: RuntimeError: a bug")
    assert priority_charges() == expected("r0", "r1")


def test_the_command_drains_the_stream_once(streams: Streams, opened, capsys) -> None:
    for record in records():
        streams.add(record)
    streams.add("{malformed")
    call_command("rounds_consume", "--stream", streams.name, "--once")
    out = capsys.readouterr().out
    assert "5 read, 4 settled, 0 reclaimed, 1 dead-lettered" in out
    assert "8 charged, 0 already charged" in out
    assert priority_charges() == expected(*CHARGES)
