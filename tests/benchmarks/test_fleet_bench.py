"""The fleet benchmark runs end to end (engines served by several processes behind the real
smg, one and two gateways, and the one queue of the same capacity), and its gains are the
policy benchmark's capture, worked here by hand."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.fleet import ONE_QUEUE, main, seeds_table, table, with_gains


def row(routing: str, policy: str, welfare: float, replicas: int = 4) -> dict:
    return {
        "workload": "gsp", "replicas": replicas, "routing": routing, "name": routing,
        "engine_policy": policy, "gateways": 1, "requests": 10, "welfare": welfare,
        "cache_hit_rate": 0.5, "mean_ttft_s": 0.1, "p99_ttft_s": 0.2,
        "urgent_mean_ttft_s": 0.05, "background_mean_ttft_s": 0.12,
        "requests_per_engine": [4, 2, 2, 2],
    }  # fmt: skip


def test_capture_and_the_share_kept_against_each_setups_own_lpm_and_highest_bid() -> None:
    rows = with_gains([
        row(ONE_QUEUE, "dfs-auction-density", -30.0),
        row(ONE_QUEUE, "lpm", -50.0),
        row(ONE_QUEUE, "highest-bid", -34.0),
        row("prefix_hash", "dfs-auction-density", -110.0),
        row("prefix_hash", "lpm", -130.0),
        row("prefix_hash", "highest-bid", -105.0),
        row("round_robin", "dfs-auction-density", -200.0),
        row("round_robin", "lpm", -200.0),
        row("round_robin", "highest-bid", -201.0),  # no gain over lpm: capture is n/a
    ])  # fmt: skip
    got = {(r["name"], r["engine_policy"]): (r["capture"], r["kept"]) for r in rows}
    # One queue: (-30 - -50) / (-34 - -50) = 20 / 16 = 1.25; kept 1 by definition.
    assert got[(ONE_QUEUE, "dfs-auction-density")] == pytest.approx((1.25, 1.0))
    # prefix_hash: (-110 - -130) / (-105 - -130) = 20 / 25 = 0.8, kept 0.8 / 1.25 = 0.64.
    assert got[("prefix_hash", "dfs-auction-density")] == pytest.approx((0.8, 0.64))
    capture, kept = got[("round_robin", "dfs-auction-density")]
    assert math.isnan(capture) and math.isnan(kept)
    # The table shows the auction's rows only, with the busiest engine over the mean (4 / 2.5).
    text = table(rows).text()
    assert text.count("gsp") == 3 and "1.60" in text and "0.64" in text


def run_of(auction: float, lpm: float, top: float, extra: bool = False) -> list[dict]:
    """One run's rows: the one queue gains 16 over lpm (capture 1.25), the fleet ``top - lpm``."""
    rows = [
        row(ONE_QUEUE, "dfs-auction-density", -30.0), row(ONE_QUEUE, "lpm", -50.0),
        row(ONE_QUEUE, "highest-bid", -34.0), row("prefix_hash", "dfs-auction-density", auction),
        row("prefix_hash", "lpm", lpm), row("prefix_hash", "highest-bid", top),
    ]  # fmt: skip
    if extra:  # a routing this run alone measured
        welfare = {"dfs-auction-density": -90.0, "lpm": -100.0, "highest-bid": -95.0}
        rows += [row("round_robin", policy, w) for policy, w in welfare.items()]
    return with_gains(rows)


def test_the_seeds_table_gives_each_runs_kept_and_their_median() -> None:
    parts = [
        # kept = ((a - l) / (t - l)) / 1.25: (20 / 25) / 1.25 = 0.64; (20 / 10) / 1.25 = 1.6;
        # (15 / 12) / 1.25 = 1.0; highest-bid gaining nothing: n/a, left out of the median.
        ("seed 0", run_of(-110.0, -130.0, -105.0, extra=True)),
        ("seed 1", run_of(-110.0, -130.0, -120.0)),
        ("seed 2", run_of(-115.0, -130.0, -118.0)),
        ("seed 3", run_of(-110.0, -130.0, -131.0)),
    ]
    lines = seeds_table(parts).rows
    assert [line[3] for line in lines] == [
        "seed 0", "seed 1", "seed 2", "seed 3", "median of 4", "pooled",
    ]  # fmt: skip
    assert [line[5] for line in lines[:4]] == ["0.64", "1.60", "1.00", "n/a"]
    # The fleet's auction and highest-bid gains over lpm; the one queue's are 20 and 16.
    assert [line[6] for line in lines[:4]] == [
        "20.00 / 25.00", "20.00 / 10.00", "15.00 / 12.00", "20.00 / -1.00",
    ]  # fmt: skip
    assert all(line[7] == "20.00 / 16.00" for line in lines[:4])
    # The median of 0.64, 1.0 and 1.6 is 1.0; two of the three are at 0.9 or more.
    assert lines[4][5] == "1.00 (2 of 3 runs at 0.9 or more)"
    # Pooled: the fleet's (20 + 20 + 15 + 20) / (25 + 10 + 12 - 1) = 75 / 46 = 1.630 over the
    # one queue's 80 / 64 = 1.25: 1.304.
    assert lines[5][5] == "1.30" and lines[5][6] == "75.00 / 46.00"


def test_a_small_fleet_runs_behind_one_and_two_gateways(tmp_path) -> None:
    out, html = tmp_path / "f.json", tmp_path / "f.html"
    argv = [
        "--replicas", "4", "--workloads", "gsp", "--groups", "12", "--per-group", "2",
        "--routings", "round_robin", "--gateways", "1", "2",
        "--engine-policies", "dfs-auction-density", "--engine-rps", "8", "--processes", "2",
        "--json", str(out), "--html", str(html), "--no-progress",
    ]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["name"], r["replicas"]) for r in rows] == [
        (ONE_QUEUE, 4),
        ("round_robin", 4),
        ("round_robin x2 gateways", 4),
    ]
    for r in rows:
        assert r["failed"] == 0 and r["requests"] == 24
    one, rr, rr2 = rows
    assert one["requests_per_engine"] == [24]
    # Round robin deals 24 requests over the four engines (two processes): 6 each; with two
    # gateways each deals its half in turn, so each engine still gets 6 (each gateway's 12
    # over four engines, 3 each).
    assert rr["requests_per_engine"] == [6, 6, 6, 6]
    assert rr2["requests_per_engine"] == [6, 6, 6, 6]
    page = html.read_text()
    assert "* plotly.js v" in page and "python -m benchmarks.fleet --replicas 4" in page
