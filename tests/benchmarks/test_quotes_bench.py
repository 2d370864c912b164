"""The quote calibration benchmark (benchmarks.quotes): its arithmetic by hand, and a small run
end to end whose probes all come back."""

from __future__ import annotations

import json

from benchmarks import quotes
from market.models import DEFAULT_POLICY


def test_it_runs_the_products_default_policy() -> None:
    assert quotes.POLICY == DEFAULT_POLICY


def test_a_cell_meets_its_probability_within_five_points() -> None:
    cell = quotes.Cell("w", 1.0, 2.0, 0.9, probes=10, quoted=20, within=17)
    assert cell.achieved == 0.85 and cell.meets  # 0.85 >= 0.9 - 0.05
    cell.within = 16
    assert not cell.meets  # 0.80 < 0.85
    assert quotes.Cell("w", 1.0, 2.0, 0.5).meets is None  # nothing quoted: no claim


def test_a_small_run_quotes_and_checks_every_probe(tmp_path) -> None:
    out = tmp_path / "quotes.json"
    html = tmp_path / "quotes.html"
    assert quotes.main(
        ["--loads", "1.0", "--requests", "160", "--probe-every", "1", "--json", str(out),
         "--html", str(html)]
    ) == 0  # fmt: skip
    saved = json.loads(out.read_text())
    assert saved["meta"]["argv"][:2] == ["--loads", "1.0"] and saved["meta"]["tolerance"] == 0.05
    rows = saved["cells"]
    # 2 workloads x 3 T x 2 p, one seed
    assert len(rows) == 12 and {r["seed"] for r in rows} == {1}
    assert {(r["workload"], r["p"]) for r in rows} == {
        (w, p) for w in ("gsp-uniform", "gsp-zipf") for p in (0.5, 0.9)
    }
    for r in rows:
        assert r["probes"] > 0 and 0 <= r["within"] <= r["quoted"] <= r["probes"]
    page = html.read_text()
    assert "<title>Quote calibration</title>" in page and "<script src=" not in page
    assert "gsp-uniform" in page and "gsp-zipf" in page and "within T" in page  # the table
