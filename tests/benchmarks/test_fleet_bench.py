"""The fleet benchmark runs end to end (engines served by several processes behind the real
smg, one and two gateways, and the one queue of the same capacity), and its gains are the
policy benchmark's capture, worked here by hand."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.fleet import ONE_QUEUE, main, table, with_gains


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
