"""The benchmark report's tail chart: the share of requests waiting at least x, per bid class."""

from __future__ import annotations

from benchmarks.figures import ttft_tail, ttft_tail_by_class
from benchmarks.metrics import PolicyMetrics, Served
from benchmarks.runner import Point, PolicyRun
from benchmarks.workloads import Workload


def test_the_tail_of_four_requests_is_the_hand_worked_one() -> None:
    # Sorted 1, 2, 3, 4 s: all four wait at least 1 s, three at least 2 s, ... one at least 4 s.
    assert ttft_tail([3.0, 1.0, 4.0, 2.0]) == ([1.0, 2.0, 3.0, 4.0], [1.0, 0.75, 0.5, 0.25])
    assert ttft_tail([]) == ([], [])


def test_a_long_tail_is_sampled_and_keeps_its_slowest_request() -> None:
    x, y = ttft_tail([float(t) for t in range(1000, 0, -1)])
    assert len(x) <= 400 and x == sorted(x)
    assert (x[0], y[0]) == (1.0, 1.0)
    assert (x[-1], y[-1]) == (1000.0, 0.001)  # the slowest, and 1 of 1000 waits that long
    # Every sampled point says how many of 1..1000 are at least x: 1001 - x of them.
    assert all(share == (1001 - t) / 1000 for t, share in zip(x, y, strict=True))


def _run(policy: str, served: list[Served]) -> PolicyRun:
    metrics = PolicyMetrics(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return PolicyRun(policy, metrics, served, makespan_s=0.0, wall_s=0.0, steps=0, rounds=0)


def test_one_panel_per_bid_class_and_one_line_per_policy() -> None:
    def served(ttfts: dict[str, list[float]]) -> list[Served]:
        return [
            Served(f"{cls}-{i}", 0.0, cls, 0.0, t, t, 0.0)
            for cls, values in ttfts.items()
            for i, t in enumerate(values)
        ]

    point = Point(Workload("w", "w"), load=1.0, capacity_rps=1.0, rate_rps=1.0)
    point.runs["lpm"] = _run("lpm", served({"urgent": [0.5, 1.0], "background": [2.0]}))
    point.runs["highest-bid"] = _run(
        "highest-bid", served({"urgent": [0.1], "background": [1.0, 8.0, 9.0, 10.0]})
    )
    fig = ttft_tail_by_class(point)
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["bid class background", "bid class urgent"]
    lines = {(t.name, t.xaxis): (list(t.x), list(t.y)) for t in fig.data}
    assert lines == {
        ("lpm", "x"): ([2.0], [1.0]),
        ("highest-bid", "x"): ([1.0, 8.0, 9.0, 10.0], [1.0, 0.75, 0.5, 0.25]),
        ("lpm", "x2"): ([0.5, 1.0], [1.0, 0.5]),
        ("highest-bid", "x2"): ([0.1], [1.0]),
    }
    assert [t.showlegend for t in fig.data] == [True, True, False, False]
    assert fig.layout.xaxis.type == fig.layout.xaxis2.type == fig.layout.yaxis.type == "log"
