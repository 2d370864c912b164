"""Round records from a real Redis stream to the live consoles, in this process (``stream.py``).

Published, then acknowledged; malformed records dead-lettered; pending entries of a dead
consumer reclaimed; replays taken again; outages leaving everything pending; the command killed
and started again taking what was written meanwhile. Round records move
no money: the requests they admit stay as the gateway left them (queued, holds open).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import redis
from django.core.management import call_command
from django.db import OperationalError

from scheduler_bridge.settlement import stream as rounds
from scheduler_bridge.settlement.stream import StreamConsumer, rounds_consume
from tests.accounts.factories import market_create, tenant_create
from tests.conftest import REPO_ROOT
from tests.scheduler_bridge.settlement.rounds_helpers import (
    RecordingPublisher,
    Streams,
    assert_no_money_moved,
    records,
    requests_open,
    round_ids,
    streams_fixture,
)
from tests.scheduler_bridge.workers import wait_until, worker_database_url

pytestmark = [pytest.mark.django_db]


streams = pytest.fixture(streams_fixture, name="streams")


@pytest.fixture
def opened() -> None:
    market = market_create()
    requests_open(tenant_create("acme"), market)


def consumer(s: Streams, name: str = "alive") -> StreamConsumer:
    return StreamConsumer(client=s.client, stream=s.name, consumer=name)


def drain(
    s: Streams, name: str = "alive", *, publisher: RecordingPublisher | None = None, **kwargs
) -> rounds.ConsumeStats:
    kwargs = {"max_seconds": 10, "until_idle": True, "block_ms": 20} | kwargs
    return rounds_consume(
        sc=consumer(s, name), publisher=publisher or RecordingPublisher(), **kwargs
    )


def test_records_are_published_then_acknowledged_and_move_no_money(
    streams: Streams, opened
) -> None:
    # Written before any consumer group exists: the new group starts at the stream's start.
    for record in records():
        streams.add(record)
    publisher = RecordingPublisher(probe=streams.pending)
    stats = drain(streams, publisher=publisher)
    # 4 records of 2 admitted requests each.
    assert (stats.read, stats.taken, stats.admitted, stats.dead, stats.failed) == (4, 4, 8, 0, 0)
    assert publisher.round_ids == round_ids(0, 1, 2, 3)
    # The four came in one read; each was published while its own entry (and the later ones)
    # was still pending: acknowledged only after it was taken.
    assert publisher.probed == [4, 3, 2, 1]
    assert publisher.flushes == 1
    assert streams.pending() == 0
    # The requests they admit are still queued, holds open, nothing charged nor spent.
    assert_no_money_moved()


def test_a_call_is_bounded_by_max_records(streams: Streams, opened) -> None:
    for record in records():
        streams.add(record)
    publisher = RecordingPublisher()
    first = drain(streams, max_records=3, publisher=publisher)
    assert (first.read, first.taken, first.admitted) == (3, 3, 6)
    assert publisher.round_ids == round_ids(0, 1, 2)
    assert streams.pending() == 0  # the three taken are acknowledged; the fourth is unread
    second = drain(streams, publisher=publisher)
    assert (second.read, second.taken, second.admitted) == (1, 1, 2)
    assert publisher.round_ids == round_ids(0, 1, 2, 3)
    assert_no_money_moved()


def test_malformed_records_go_to_the_dead_letter_stream_and_the_rest_are_taken(
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
    publisher = RecordingPublisher()
    stats = drain(streams, publisher=publisher)
    assert (stats.read, stats.taken, stats.dead, stats.admitted) == (7, 2, 5, 4)
    assert publisher.round_ids == round_ids(0, 3)  # no malformed record reaches the consoles
    assert streams.pending() == 0  # the dead ones are acknowledged too: nothing blocks
    dead = streams.client.xrange(streams.dead)
    assert [entry[b"dead_source_id"] for _, entry in dead] == bad_ids
    errors = [entry[b"dead_error"].decode() for _, entry in dead]
    assert "not JSON" in errors[0] and "not JSON" in errors[1]
    assert "unknown schema" in errors[2] and "negative amount" in errors[3]
    assert "no 'record' field" in errors[4]
    assert dead[1][1][b"record"] == b"\xff\xfe not utf-8"  # kept as it came, for inspection
    assert_no_money_moved()


def test_entries_a_dead_consumer_left_pending_are_reclaimed(streams: Streams, opened) -> None:
    for record in records():
        streams.add(record)
    rounds.rounds_group_ensure(sc=consumer(streams))
    # A consumer reads three entries and dies before acknowledging any of them.
    streams.client.xreadgroup("settlement", "dead", {streams.name: ">"}, count=3)
    assert streams.pending() == 3
    # Not idle long enough: another consumer leaves them alone and takes the fourth.
    publisher = RecordingPublisher()
    stats = drain(streams, claim_min_idle_ms=60_000, publisher=publisher)
    assert (stats.read, stats.reclaimed, stats.taken, stats.admitted) == (1, 0, 1, 2)
    assert publisher.round_ids == round_ids(3)
    assert streams.pending() == 3
    stats = drain(streams, claim_min_idle_ms=0, publisher=publisher)
    assert (stats.read, stats.reclaimed, stats.taken, stats.admitted) == (3, 3, 3, 6)
    assert publisher.round_ids == round_ids(3, 0, 1, 2)
    assert streams.pending() == 0
    assert_no_money_moved()

    # The dead consumer has nothing pending any more: it is removed once idle long enough.
    def members() -> set[bytes]:
        return {c["name"] for c in streams.client.xinfo_consumers(streams.name, "settlement")}

    assert members() == {b"dead", b"alive"}
    drain(streams, prune_idle_ms=0)
    assert members() == {b"alive"}


def test_a_replayed_stream_is_taken_again_and_moves_no_money(streams: Streams, opened) -> None:
    entries = records()
    for record in entries:
        streams.add(record)
    assert (drain(streams).taken, streams.pending()) == (4, 0)
    # A second group reads the same stream from its start; then the same records arrive again.
    publisher = RecordingPublisher()
    replay = rounds_consume(
        sc=StreamConsumer(client=streams.client, stream=streams.name, group="replay"),
        max_seconds=10,
        until_idle=True,
        block_ms=20,
        publisher=publisher,
    )
    for record in entries:
        streams.add(record)
    again = drain(streams, publisher=publisher)
    for stats in (replay, again):
        assert (stats.read, stats.taken, stats.admitted, stats.dead) == (4, 4, 8, 0)
    assert publisher.round_ids == round_ids(0, 1, 2, 3) * 2
    assert (streams.pending(), streams.pending("replay")) == (0, 0)
    assert_no_money_moved()


@pytest.mark.parametrize(
    "error",
    [OperationalError("connection refused"), redis.ConnectionError("Connection refused")],
    ids=["database", "redis"],
)
def test_an_outage_leaves_the_records_pending(
    streams: Streams, opened, monkeypatch, error: Exception
) -> None:
    for record in records(rounds=2):
        streams.add(record)

    def down(raw):
        raise error

    monkeypatch.setattr(rounds, "round_record_loads", down)
    publisher = RecordingPublisher()
    stats = drain(streams, publisher=publisher)
    assert stats.stalled.startswith(f"{type(error).__name__}: ")
    assert (stats.taken, stats.dead, stats.failed) == (0, 0, 0)
    assert publisher.records == []
    assert streams.pending() == 2  # read, not acknowledged, not dead-lettered
    assert streams.client.xlen(streams.dead) == 0
    monkeypatch.undo()
    stats = drain(streams, claim_min_idle_ms=0, publisher=publisher)
    assert (stats.reclaimed, stats.taken, stats.admitted, stats.stalled) == (2, 2, 4, "")
    assert publisher.round_ids == round_ids(0, 1)
    assert streams.pending() == 0
    assert_no_money_moved()


def test_a_record_that_keeps_failing_is_set_aside_after_max_deliveries(
    streams: Streams, opened, monkeypatch
) -> None:
    streams.add(records()[0])
    poison = streams.add(records()[1])
    real = rounds.round_record_loads

    def flaky(raw):
        record = real(raw)
        if record["round_id"] == "sim:1:1":
            raise RuntimeError("a bug")
        return record

    monkeypatch.setattr(rounds, "round_record_loads", flaky)
    publisher = RecordingPublisher()
    first = drain(streams, max_deliveries=3, publisher=publisher)
    assert (first.taken, first.failed, first.dead) == (1, 1, 0)
    assert streams.pending() == 1  # the poison, left for a retry
    second = drain(streams, max_deliveries=3, claim_min_idle_ms=0, publisher=publisher)
    assert (second.reclaimed, second.failed, second.dead) == (1, 1, 0)  # delivery 2
    third = drain(streams, max_deliveries=3, claim_min_idle_ms=0, publisher=publisher)
    assert (third.reclaimed, third.failed, third.dead) == (1, 0, 1)  # delivery 3: set aside
    assert streams.pending() == 0
    ((_, dead),) = streams.client.xrange(streams.dead)
    assert dead[b"dead_source_id"] == poison
    assert dead[b"dead_error"].startswith(b"failed 3 times, last: RuntimeError: a bug")
    assert publisher.round_ids == round_ids(0)
    assert_no_money_moved()


def test_the_command_drains_the_stream_once(streams: Streams, opened, capsys) -> None:
    for record in records():
        streams.add(record)
    streams.add("{malformed")
    call_command("rounds_consume", "--stream", streams.name, "--once")
    out = capsys.readouterr().out
    assert "records: 5 read, 4 taken, 0 reclaimed, 1 dead-lettered, 0 failed" in out
    assert "; 8 admitted requests" in out  # 4 records x 2
    assert "charged" not in out
    assert streams.pending() == 0
    assert_no_money_moved()


@pytest.mark.django_db(transaction=True)
def test_the_command_killed_and_restarted_takes_what_was_written_meanwhile_once(
    streams: Streams, opened
) -> None:
    """``manage.py rounds_consume`` in a subprocess, SIGKILLed and started again: the records
    written while none ran are taken by the next, and nothing twice."""
    rec = records()
    env = os.environ.copy() | {"DATABASE_URL": worker_database_url()}
    command = [sys.executable, "manage.py", "rounds_consume", "--stream", streams.name,
               "--consumer", "command"]  # fmt: skip

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip

    def delivered_up_to(entry: bytes) -> bool:
        groups = streams.client.xinfo_groups(streams.name)
        return bool(groups) and groups[0]["last-delivered-id"] == entry and not streams.pending()

    taker = start()
    try:
        streams.add(rec[0])
        last = streams.add(rec[1])  # written while it runs
        wait_until(lambda: delivered_up_to(last), what="rounds 0 and 1")
        taker.send_signal(signal.SIGKILL)
        taker.wait(timeout=10)
        streams.add(rec[2])
        last = streams.add(rec[3])  # written while none runs
        assert not delivered_up_to(last)
        taker = start()
        wait_until(lambda: delivered_up_to(last), what="rounds 2 and 3")
        taker.send_signal(signal.SIGTERM)  # a clean stop prints what it did
        out, _ = taker.communicate(timeout=20)
    finally:
        if taker.poll() is None:
            taker.kill()
            taker.wait()
    assert taker.returncode == 0, out
    # The second took rounds 2 and 3 only: 2 records x 2 admitted.
    assert "records: 2 read, 2 taken, 0 reclaimed, 0 dead-lettered" in out, out
    assert "; 4 admitted requests" in out, out
    assert_no_money_moved()
