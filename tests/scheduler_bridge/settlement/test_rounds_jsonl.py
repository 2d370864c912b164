"""The JSONL follower (embedded mode, no Redis): offsets, partial lines, restarts, dead letters.

In this process, then as ``manage.py rounds_consume --jsonl PATH --follow`` in a subprocess that
is SIGKILLed and restarted.
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
    CHARGES,
    CHARGES_TOTAL,
    expected,
    priority_charges,
    records,
    requests_open,
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
def test_lines_are_settled_once_and_the_offset_survives_restarts(tmp_path: Path, opened) -> None:
    path, rec = tmp_path / "rounds.jsonl", records()
    assert rounds_jsonl_follow(path=path).read == 0  # no file yet: nothing, no error
    append(path, rec[0], rec[1])
    first = rounds_jsonl_follow(path=path)
    assert (first.read, first.charged) == (2, 4)
    assert position_load(tmp_path / "rounds.jsonl.offset").offset == path.stat().st_size
    # The engine is in the middle of writing round 2: half a line is left for later.
    line = json.dumps(rec[2]) + "\n"
    append(path, line[:40])
    assert rounds_jsonl_follow(path=path).read == 0
    append(path, line[40:], rec[3])
    second = rounds_jsonl_follow(path=path)  # a restart: it resumes at its offset
    assert (second.read, second.charged, second.duplicates) == (2, 4, 0)
    assert priority_charges() == expected(*CHARGES)


@pytest.mark.django_db
def test_a_lost_offset_or_a_truncated_file_charges_nothing_twice(tmp_path: Path, opened) -> None:
    path, rec = tmp_path / "rounds.jsonl", records()
    append(path, *rec)
    assert rounds_jsonl_follow(path=path).charged == 8
    (tmp_path / "rounds.jsonl.offset").unlink()  # the state is lost: all read again
    again = rounds_jsonl_follow(path=path)
    assert (again.read, again.charged, again.duplicates) == (4, 0, 8)
    path.write_text(json.dumps(rec[0]) + "\n")  # the file starts over, shorter than the offset
    restarted = rounds_jsonl_follow(path=path)
    assert (restarted.read, restarted.charged, restarted.duplicates) == (1, 0, 2)
    assert sum(priority_charges().values()) == CHARGES_TOTAL


@pytest.mark.django_db
def test_malformed_lines_go_to_the_dead_letter_file(tmp_path: Path, opened) -> None:
    path, rec = tmp_path / "rounds.jsonl", records()
    append(path, rec[0], "{not json\n", dict(rec[1], schema="nope"), "\n", rec[2])
    stats = rounds_jsonl_follow(path=path)
    assert (stats.settled, stats.dead, stats.charged) == (2, 2, 4)
    dead = [json.loads(line) for line in (tmp_path / "rounds.jsonl.dead").read_text().splitlines()]
    assert [d["line"] for d in dead] == ["{not json", json.dumps(dict(rec[1], schema="nope"))]
    assert "not JSON" in dead[0]["error"] and "unknown schema" in dead[1]["error"]
    assert priority_charges() == expected("r0", "r1", "r4", "r5")


@pytest.mark.django_db
def test_the_command_without_follow_settles_and_reports(tmp_path: Path, opened, capsys) -> None:
    path = tmp_path / "rounds.jsonl"
    append(path, *records())
    call_command("rounds_consume", "--jsonl", str(path), "--state", str(tmp_path / "state"))
    out = capsys.readouterr().out
    assert "4 read, 4 settled" in out and "8 charged" in out
    assert position_load(tmp_path / "state").offset == path.stat().st_size


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_follower_process_killed_and_restarted_settles_everything_once(
    tmp_path: Path, opened
) -> None:
    path, rec = tmp_path / "rounds.jsonl", records()
    env = os.environ.copy() | {"DATABASE_URL": worker_database_url()}
    command = [sys.executable, "manage.py", "rounds_consume", "--jsonl", str(path), "--follow"]

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip

    follower = start()
    try:
        append(path, rec[0], rec[1])  # appended while it follows
        wait_until(lambda: len(priority_charges()) == 4, what="rounds 0 and 1")
        follower.send_signal(signal.SIGKILL)
        follower.wait(timeout=10)
        append(path, rec[2], rec[3])  # written while no follower runs
        follower = start()
        wait_until(lambda: len(priority_charges()) == 8, what="rounds 2 and 3")
        follower.send_signal(signal.SIGTERM)  # a clean stop prints what it did
        out, _ = follower.communicate(timeout=20)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, out
    assert "requests: 4 charged" in out  # the restart resumed at its offset: rounds 2, 3 only
    assert priority_charges() == expected(*CHARGES)
    assert position_load(tmp_path / "rounds.jsonl.offset").offset == path.stat().st_size
