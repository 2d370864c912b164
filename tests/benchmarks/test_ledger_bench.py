"""``benchmarks.ledger``'s table and its docs block, from points made by hand."""

from __future__ import annotations

import pytest

from accounts.models import LedgerEntry, Request, RequestStatus
from benchmarks.docs import ledger_block
from benchmarks.ledger import Point, _cpu_spent, history_write, parse_args, table
from benchmarks.progress import Progress


def _point(mode: str, offered: float | None, cpu_ms: float, settled_per_s: float) -> Point:
    return Point(
        mode=mode, offered=offered, seconds=10.0, held=3000, settled=3000, refused=0, errors=1,
        held_per_s=settled_per_s, settled_per_s=settled_per_s, pg_backends_cpu_ms=cpu_ms * 0.9,
        pg_cpu_ms=cpu_ms, wal_bytes=3950.4, settle_p50_ms=2.0, settle_p99_ms=9.5, hold_p50_ms=1.0,
        hold_p99_ms=4.25,
    )  # fmt: skip


def test_each_way_is_compared_with_the_floor_at_its_own_rate() -> None:
    points = [
        _point("floor", 300.0, 0.2, 300.0),
        _point("batched 64 / 2 ms", 300.0, 0.5, 291.0),
        _point("floor", None, 0.1, 900.0),
        _point("batched 64 / 2 ms", None, 0.45, 450.0),
    ]
    rows = table(points).rows
    # 0.5 / 0.2 = 2.5; 291 / 300 = 0.97; the closed loop: 0.45 / 0.1 = 4.5, no offered rate.
    assert [row[0:2] for row in rows] == [
        ("floor", "300"), ("batched 64 / 2 ms", "300"), ("floor", "max"),
        ("batched 64 / 2 ms", "max"),
    ]  # fmt: skip
    assert [row[4] for row in rows] == ["1.00", "0.97", "", ""]
    assert [row[7] for row in rows] == ["1.00", "2.50", "1.00", "4.50"]
    assert rows[1][5:] == ("0.450", "0.500", "2.50", "3,950", "2.0", "9.5", "4.2", 1)


def test_the_docs_block_names_its_command_and_holds_the_table() -> None:
    doc = {
        "command": "python -m benchmarks.ledger --rates 300",
        "writers": 2, "duration_s": 8.0, "service_ms": 5.0, "cpus": 2,
        "points": [vars(_point("floor", 300.0, 0.2, 300.0))],
    }  # fmt: skip
    block = ledger_block(doc)
    assert block.startswith("`python -m benchmarks.ledger --rates 300`: 2 writers, 8 s a point")
    assert "| floor | 300 | 300 | 300 | 1.00 | 0.180 | 0.200 | 1.00 |" in block


def test_the_batched_ways_are_named_by_size_and_interval() -> None:
    args = parse_args(["--batch", "64:0.002,8:0.01", "--rates", "100,max"])
    assert args.batches == {"batched 64 / 2 ms": (64, 0.002), "batched 8 / 10 ms": (8, 0.01)}
    assert args.rates == [100.0, None]


@pytest.mark.django_db
def test_the_history_brings_the_ledger_to_its_size_once() -> None:
    Request.objects.all().delete()
    progress = Progress(1, enabled=False)
    assert history_write(3, progress) == 3
    assert history_write(3, progress) == 0  # already that many
    served = Request.objects.filter(status=RequestStatus.SERVED)
    assert served.count() == 3
    # Each one settled with a token charge and a priority charge.
    assert LedgerEntry.objects.filter(request__in=served).count() == 6


def test_the_cpu_of_a_process_started_during_a_point_counts_whole() -> None:
    # pid 1 ran throughout (2.0 -> 2.5 s), pid 2 started during the point (0.75 s since its
    # start), pid 3 ended during it (its CPU went with it): 0.5 + 0.75 = 1.25 s. Counting only
    # the processes read before the point (as the benchmark did) gives 0.5 s.
    assert _cpu_spent({1: 2.0, 3: 4.0}, {1: 2.5, 2: 0.75}) == 1.25
