"""The plugin's benchmark command runs (``python -m benchmarks.sglang_plugin``): a small size,
its JSON (the command and its rows), and ratios that are each contender's time over SGLang's
dfs-weight, recomputed here from the same row."""

from __future__ import annotations

import json

import pytest

from benchmarks.sglang_plugin import COLUMNS, main


def test_the_plugin_benchmark_runs_and_writes_its_rows(tmp_path, capsys) -> None:
    out = tmp_path / "plugin.json"
    main(["--sizes", "150", "--churn", "0.05", "--rounds", "2", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["meta"]["command"].startswith("python -m benchmarks.sglang_plugin --sizes 150")
    (row,) = doc["rows"]
    assert (row["requests"], row["churn"], row["admitted_per_round"]) == (150, 0.05, 8)
    base = row["sglang_dfs_weight_ms"]
    for name in COLUMNS:
        assert row[f"{name}_ms"] > 0
        assert row[f"{name}_ratio"] == pytest.approx(row[f"{name}_ms"] / base)
    assert row["changes_applied"] > 0  # the plugin followed the cache's inserts
    printed = capsys.readouterr().out
    assert "SGLang dfs-weight" in printed and "lpm, no fallback" in printed


def test_the_plugin_benchmark_refuses_a_churn_outside_0_to_1() -> None:
    with pytest.raises(SystemExit):
        main(["--sizes", "150", "--churn", "1.5"])
