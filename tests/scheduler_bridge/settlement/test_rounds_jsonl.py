"""The JSONL follower (embedded mode, no Redis): offsets, partial lines, restarts, dead letters.

In this process, then as ``manage.py rounds_consume --jsonl PATH --follow`` in a subprocess that
is SIGKILLed and restarted. The records move no money: the requests they admit stay queued.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from scheduler_bridge.settlement.jsonl import position_load, rounds_jsonl_follow
from tests.accounts.factories import market_create, tenant_create
from tests.conftest import REPO_ROOT
from tests.scheduler_bridge.settlement.rounds_helpers import (
    RecordingPublisher,
    assert_no_money_moved,
    records,
    requests_open,
    round_ids,
)
from tests.scheduler_bridge.workers import wait_until, worker_database_url


@pytest.fixture
def opened() -> None:
    requests_open(tenant_create("acme"), market_create())


def append(path: Path, *lines: str | dict) -> None:
    with path.open("a", encoding="utf-8") as f:
        for line in lines:
            f.write(line if isinstance(line, str) else json.dumps(line) + "\n")


@pytest.mark.django_db
def test_lines_are_taken_once_and_the_offset_survives_restarts(tmp_path: Path, opened) -> None:
    path, rec = tmp_path / "rounds.jsonl", records()
    publisher = RecordingPublisher()
    # No file yet: nothing, no error.
    assert rounds_jsonl_follow(path=path, publisher=publisher).read == 0
    append(path, rec[0], rec[1])
    first = rounds_jsonl_follow(path=path, publisher=publisher)
    assert (first.read, first.taken, first.admitted) == (2, 2, 4)
    assert position_load(tmp_path / "rounds.jsonl.offset").offset == path.stat().st_size
    # The engine is in the middle of writing round 2: half a line is left for later.
    line = json.dumps(rec[2]) + "\n"
    append(path, line[:40])
    assert rounds_jsonl_follow(path=path, publisher=publisher).read == 0
    append(path, line[40:], rec[3])
    second = rounds_jsonl_follow(path=path, publisher=publisher)  # a restart: at its offset
    assert (second.read, second.taken, second.admitted) == (2, 2, 4)
    assert publisher.round_ids == round_ids(0, 1, 2, 3)  # each once
    assert publisher.flushes == 4  # once per call
    assert_no_money_moved()


@pytest.mark.django_db
def test_a_lost_offset_or_a_truncated_file_is_read_again_harmlessly(tmp_path: Path, opened) -> None:
    path, rec = tmp_path / "rounds.jsonl", records()
    append(path, *rec)
    publisher = RecordingPublisher()
    assert rounds_jsonl_follow(path=path, publisher=publisher).taken == 4
    (tmp_path / "rounds.jsonl.offset").unlink()  # the state is lost: all read again
    again = rounds_jsonl_follow(path=path, publisher=publisher)
    assert (again.read, again.taken, again.admitted) == (4, 4, 8)
    path.write_text(json.dumps(rec[0]) + "\n")  # the file starts over, shorter than the offset
    restarted = rounds_jsonl_follow(path=path, publisher=publisher)
    assert (restarted.read, restarted.taken, restarted.admitted) == (1, 1, 2)
    assert publisher.round_ids == round_ids(0, 1, 2, 3) * 2 + round_ids(0)
    assert_no_money_moved()


@pytest.mark.django_db
def test_malformed_lines_go_to_the_dead_letter_file(tmp_path: Path, opened) -> None:
    path, rec = tmp_path / "rounds.jsonl", records()
    append(path, rec[0], "{not json\n", dict(rec[1], schema="nope"), "\n", rec[2])
    publisher = RecordingPublisher()
    stats = rounds_jsonl_follow(path=path, publisher=publisher)
    # Five lines read (the blank one too): two taken, two dead, the blank one skipped.
    assert (stats.read, stats.taken, stats.dead, stats.admitted) == (5, 2, 2, 4)
    assert publisher.round_ids == round_ids(0, 2)
    dead = [json.loads(line) for line in (tmp_path / "rounds.jsonl.dead").read_text().splitlines()]
    assert [d["line"] for d in dead] == ["{not json", json.dumps(dict(rec[1], schema="nope"))]
    assert "not JSON" in dead[0]["error"] and "unknown schema" in dead[1]["error"]
    assert position_load(tmp_path / "rounds.jsonl.offset").offset == path.stat().st_size
    assert_no_money_moved()


@pytest.mark.django_db
def test_the_command_without_follow_takes_and_reports(tmp_path: Path, opened, capsys) -> None:
    path = tmp_path / "rounds.jsonl"
    append(path, *records())
    call_command("rounds_consume", "--jsonl", str(path), "--state", str(tmp_path / "state"))
    out = capsys.readouterr().out
    assert "records: 4 read, 4 taken, 0 reclaimed, 0 dead-lettered" in out
    assert "; 8 admitted requests" in out  # 4 records x 2
    assert position_load(tmp_path / "state").offset == path.stat().st_size
    assert_no_money_moved()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_follower_process_killed_and_restarted_resumes_at_its_offset(
    tmp_path: Path, opened
) -> None:
    path, rec = tmp_path / "rounds.jsonl", records()
    state = tmp_path / "rounds.jsonl.offset"
    env = os.environ.copy() | {"DATABASE_URL": worker_database_url()}
    command = [sys.executable, "manage.py", "rounds_consume", "--jsonl", str(path), "--follow"]

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip

    def offset_at_end() -> bool:
        return path.exists() and position_load(state).offset == path.stat().st_size

    follower = start()
    try:
        append(path, rec[0], rec[1])  # appended while it follows
        wait_until(offset_at_end, what="rounds 0 and 1")
        follower.send_signal(signal.SIGKILL)
        follower.wait(timeout=10)
        append(path, rec[2], rec[3])  # written while no follower runs
        assert not offset_at_end()
        follower = start()
        wait_until(offset_at_end, what="rounds 2 and 3")
        follower.send_signal(signal.SIGTERM)  # a clean stop prints what it did
        out, _ = follower.communicate(timeout=20)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, out
    # The restart resumed at its offset: rounds 2 and 3 only, 2 records x 2 admitted.
    assert "records: 2 read, 2 taken, 0 reclaimed, 0 dead-lettered" in out, out
    assert "; 4 admitted requests" in out, out
    assert_no_money_moved()
