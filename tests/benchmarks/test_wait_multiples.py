"""The wait bound's benchmark of multiples, densities and steps (benchmarks.wait_multiples) and its
docs block: the goal figures it keeps and the counts the block shows, worked out by hand."""

from __future__ import annotations

import math

import pytest

from benchmarks import docs
from benchmarks.wait_multiples import goal_of, main, part_argv, part_rows
from mechanism import DEFAULT_POLICY


def metrics(mean_ttft_s: float, p99_ttft_s: float, hit: float, welfare: float) -> dict:
    return {
        "mean_ttft_s": mean_ttft_s, "p50_ttft_s": mean_ttft_s, "p99_ttft_s": p99_ttft_s,
        "mean_e2e_s": mean_ttft_s + 1, "cache_hit_rate": hit, "throughput_tokens_per_s": 1000.0,
        "welfare": welfare, "revenue": 0.0,
    }  # fmt: skip


def test_a_part_keeps_the_default_policys_goal_figures_at_each_point() -> None:
    grid = [
        {
            "kv_capacity_tokens": 100_000, "groups": 64, "load": 1.1,
            "policies": {
                "lpm": metrics(10.0, 30.0, 0.80, -1000.0),
                "dfs-weight": metrics(8.0, 40.0, 0.78, -900.0),
                "highest-bid": metrics(20.0, 90.0, 0.50, -200.0),
                DEFAULT_POLICY: metrics(8.2, 36.0, 0.795, -400.0),
            },
        }
    ]  # fmt: skip
    (row,) = part_rows({"sweep": {"grid": grid}}, 8.0, 0.003, 8)
    # capture (-400 - -1000) / (-200 - -1000) = 600 / 800; hit 79.5 - 80 = -0.5 pp;
    # TTFT 8.2 / min(10, 8) = 1.025; p99 36 / 30 = 1.2: every check passes.
    assert (row["multiple"], row["density"], row["steps"]) == (8.0, 0.003, 8)
    assert (row["kv"], row["groups"], row["load"]) == (100_000, 64, 1.1)
    assert row["capture"] == pytest.approx(0.75)
    assert row["hit_gap_pp"] == pytest.approx(-0.5)
    assert row["ttft_vs_best"] == pytest.approx(1.025)
    assert row["tail_vs_lpm"] == pytest.approx(1.2)
    assert goal_of(row).passes == (True, True, False, True)  # 0.75 < 0.8


def row(
    multiple: float, density: float, kv: int, capture: float | None, tail: float, steps: int = 8
) -> dict:
    return {"multiple": multiple, "density": density, "steps": steps, "kv": kv, "groups": 8,
            "load": 1.0, "capture": capture, "hit_gap_pp": 0.0, "ttft_vs_best": 1.0,
            "tail_vs_lpm": tail}  # fmt: skip


def test_the_block_counts_each_pairs_points_met_and_each_checks_misses() -> None:
    rows = [
        row(6, 0.003, 400_000, 0.7, 1.0),  # capture misses
        row(6, 0.003, 400_000, 0.9, 1.0),  # met
        row(6, 0.003, 100_000, None, 1.3),  # capture n/a; p99 misses
        row(8, 0.003, 400_000, 0.85, 1.1),  # met
        row(8, 0.003, 400_000, 0.9, 1.0),  # met
        row(8, 0.003, 100_000, None, 1.2),  # met: capture does not apply
        row(8, 0.004, 400_000, 0.5, 1.0),  # capture misses
        row(8, 0.003, 400_000, 0.9, 1.4, steps=16),  # p99 misses
    ]
    meta = {"argv": ["--multiples", "6,8"], "policy": DEFAULT_POLICY,
            "in_force": [8.0, 0.003, 8]}  # fmt: skip
    text = docs.wait_multiples_block({"meta": meta, "rows": rows})
    assert "`python -m benchmarks.wait_multiples --multiples 6,8`" in text
    lines = text.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("| multiple")))
    # By steps, then density, then multiple; the setting in force is all three.
    assert lines[at + 2 :] == [
        "| 6 | 0.003 | 8 | 1 of 2 | 0 of 1 | 1 of 3 | 0 | 0 | 1 | 1 |",
        "| 8 | 0.003 | 8 (in force) | 2 of 2 | 1 of 1 | 3 of 3 | 0 | 0 | 0 | 0 |",
        "| 8 | 0.004 | 8 | 0 of 1 | 0 of 0 | 0 of 1 | 0 | 0 | 1 | 0 |",
        "| 8 | 0.003 | 16 | 0 of 1 | 0 of 0 | 0 of 1 | 0 | 0 | 0 | 1 |",
    ]
    assert math.isnan(goal_of(rows[2]).capture)


def test_a_part_runs_the_sweep_at_its_setting_with_the_goals_policies() -> None:
    argv = part_argv(7.5, 0.0025, 12, 100_000, 256)
    assert argv[argv.index("--wait-multiple") + 1] == "7.5"
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert sets == ["wait_density=0.0025", "wait_steps=12"]
    assert argv[argv.index("--sweep-kv") + 1] == "100000"
    assert argv[argv.index("--sweep-groups") + 1] == "256"
    assert argv[argv.index("--policies") + 1].split(",") == [
        "lpm", "dfs-weight", "highest-bid", DEFAULT_POLICY
    ]  # fmt: skip


def test_a_multiple_that_is_no_multiple_is_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--multiples", "0,8"])
    assert "--multiples: expected positive numbers: '0,8'" in capsys.readouterr().err


def test_steps_that_are_no_count_are_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--steps", "8,0"])
    assert "--steps: expected positive" in capsys.readouterr().err
