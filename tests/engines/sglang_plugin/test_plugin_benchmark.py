"""The plugin's benchmark command runs (``python -m benchmarks.sglang_plugin``): a small size,
its JSON rows, and a ratio that is the plugin's time over SGLang's, recomputed here."""

from __future__ import annotations

import json

import pytest

from benchmarks.sglang_plugin import main


def test_the_plugin_benchmark_runs_and_writes_its_rows(tmp_path, capsys) -> None:
    out = tmp_path / "plugin.json"
    main(["--sizes", "120", "--reps", "1", "--admitted", "8", "--json", str(out)])
    (row,) = json.loads(out.read_text())
    assert row["requests"] == 120
    assert row["sglang_dfs_weight_ms"] > 0 and row["plugin_dfs_auction_density_ms"] > 0
    ratio = row["plugin_dfs_auction_density_ms"] / row["sglang_dfs_weight_ms"]
    assert row["ratio"] == pytest.approx(ratio)
    assert 0 < row["auction_ms"] <= row["plugin_dfs_auction_density_ms"] * 1.5
    assert "SGLang dfs-weight" in capsys.readouterr().out
