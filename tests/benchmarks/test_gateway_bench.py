"""The gateway benchmark's arithmetic (benchmarks.gateway): percentiles, the saturation point,
the medians over repeats, memory growth; each checked against a hand-worked example."""

from __future__ import annotations

import math

import pytest

from benchmarks.gateway import (
    PathResult,
    RatePoint,
    ServerRun,
    merged,
    parse_configs,
    percentile,
    rss_growth,
    saturation_rate,
    summary,
)


def path(achieved: float, offered: float, p99: float = 10.0) -> PathResult:
    return PathResult(
        sent=int(offered * 10), ok=int(achieved * 10), errors=0, offered_rate=offered,
        achieved_rate=achieved, p50_ms=1.0, p95_ms=5.0, p99_ms=p99, mean_ms=2.0,
        ttfb_p50_ms=1.0, ttfb_p95_ms=5.0, ttfb_p99_ms=p99,
    )  # fmt: skip


def point(rate: float, *, achieved: float, added_p99: float, cpu: float = 4.0) -> RatePoint:
    """A point whose gateway stream sent exactly ``rate`` per second, its p99 ``added_p99`` ms
    above the engine's 2 ms."""
    return RatePoint(
        rate=rate, stream=False, gateway=path(achieved, rate, p99=2 + added_p99),
        direct=path(rate, rate, p99=2.0), gateway_cpu_ms_per_request=cpu,
    )  # fmt: skip


def test_percentile_is_the_benchmarks_one_linear_between_ranks() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100: rank r (0-based) holds r + 1
    # p50: rank 99 x 0.50 = 49.5, between 50 and 51; p95: 94.05 -> 95.05; p99: 98.01 -> 99.01.
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 95) == pytest.approx(95.05)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_a_rate_is_carried_at_97_percent_of_what_was_sent_and_an_added_p99_of_50_ms() -> None:
    assert point(100, achieved=97.0, added_p99=50.0).carried
    assert not point(100, achieved=96.9, added_p99=10.0).carried
    assert not point(100, achieved=100.0, added_p99=50.1).carried


def test_the_saturation_point_is_the_last_rate_of_an_unbroken_run_of_carried_rates() -> None:
    sweep = [
        point(50, achieved=50, added_p99=5),
        point(100, achieved=99, added_p99=20),
        point(150, achieved=120, added_p99=900),  # not carried
        point(200, achieved=199, added_p99=30),  # carried again, but after a break
    ]
    assert saturation_rate(sweep) == 100
    assert saturation_rate([point(50, achieved=10, added_p99=5)]) is None


def test_repeats_merge_into_medians_per_rate() -> None:
    """Three repeats of one configuration: at 100 req/s the added p99 was 10, 70 and 20 ms
    (median 20: carried); the second repeat stopped after 100, so 150 is in only two repeats
    and is dropped."""
    repeats = [
        ServerRun("uvicorn", 2, sweep=[point(100, achieved=100, added_p99=10, cpu=3.0),
                                       point(150, achieved=150, added_p99=12)]),
        ServerRun("uvicorn", 2, sweep=[point(100, achieved=100, added_p99=70, cpu=5.0)]),
        ServerRun("uvicorn", 2, sweep=[point(100, achieved=100, added_p99=20, cpu=4.0),
                                       point(150, achieved=150, added_p99=14)]),
    ]  # fmt: skip
    (run,) = merged(repeats)
    assert [p.rate for p in run.sweep] == [100]
    # The gateway's p99 per repeat: 12, 72 and 22 ms (median 22); the engine's 2 ms.
    assert run.sweep[0].gateway.p99_ms == 22
    assert run.sweep[0].added("p99_ms") == 20
    assert run.sweep[0].gateway_cpu_ms_per_request == 4.0
    assert run.saturation_rate == 100


def test_the_summary_divides_each_saturation_point_by_daphnes() -> None:
    daphne = ServerRun("daphne", 1, sweep=[point(50, achieved=50, added_p99=9)])
    daphne.saturation_rate = 50
    uvicorn = ServerRun("uvicorn", 2, sweep=[point(50, achieved=50, added_p99=4)])
    uvicorn.saturation_rate = 150
    rows = {r["config"]: r for r in summary([daphne, uvicorn], target_rate=50)}
    assert rows["uvicorn:2"]["saturation_over_daphne"] == 3.0
    assert rows["daphne:1"]["saturation_over_daphne"] == 1.0
    assert rows["uvicorn:2"]["added_p99_ms"] == 4


def test_memory_growth_compares_the_last_minute_with_the_first() -> None:
    # Every 30 s for 5 minutes: 100 MiB for the first minute, then 104 MiB.
    samples = [(t, 100 if t <= 60 else 104) for t in range(0, 301, 30)]
    # First minute: t = 0, 30, 60 -> 100; last minute: t = 240, 270, 300 -> 104.
    assert rss_growth(samples) == pytest.approx(0.04)


def test_configurations_parse_and_bad_ones_are_refused() -> None:
    assert parse_configs("daphne:1, uvicorn:2,granian") == [
        ("daphne", 1), ("uvicorn", 2), ("granian", 1),
    ]  # fmt: skip
    assert parse_configs("floor:2,floor") == [("floor", 2), ("floor", 0)]
    for bad in ("daphne:2", "nginx:1", "uvicorn:0", "floor:9", ""):
        with pytest.raises(ValueError):
            parse_configs(bad)
