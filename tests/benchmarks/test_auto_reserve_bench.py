"""The automatic reserve's benchmark (benchmarks.auto_reserve): a small run end to end, each
interval's move checked against the rule's bounds (never more than an eighth either way, up when
the priority wait was above the target, down when below, still with no evidence), the fixed run
never moving."""

from __future__ import annotations

import json

from benchmarks import auto_reserve
from market.models import DEFAULT_POLICY, DEFAULT_RESERVE_MAX


def test_it_runs_the_products_default_policy_and_ceiling() -> None:
    assert auto_reserve.POLICY == DEFAULT_POLICY
    assert auto_reserve.CEILING == float(DEFAULT_RESERVE_MAX)


def test_a_small_run_moves_the_reserve_within_the_rule(tmp_path, capsys) -> None:
    out, page = tmp_path / "auto.json", tmp_path / "auto.html"
    args = ["--requests", "1500", "--load", "1.3", "--target", "0.5", "--interval", "2"]
    assert auto_reserve.main([*args, "--json", str(out), "--html", str(page)]) == 0
    result = json.loads(out.read_text())
    auto, fixed = result["intervals"]["automatic"], result["intervals"]["fixed"]
    assert len(auto) == len(fixed) > 10
    assert {i["reserve"] for i in fixed} == {0.001}  # nobody moves it
    moved = 0
    for before, after in zip(auto, auto[1:], strict=False):
        assert after["reserve"] == before["next_reserve"]  # the step's reserve is in force next
    for i in auto:
        r, new, wait = i["reserve"], i["next_reserve"], i["wait_s"]
        assert r * 7 / 8 - 1e-9 <= new <= r * 9 / 8 + 1e-9, i  # at most 12.5% a step
        if wait is None:
            assert new == r if i["served"] == 0 else new < r, i
        elif wait > 0.5:
            assert new >= r, i
        elif wait < 0.5:
            assert new <= r, i
        moved += new != r
    assert moved > len(auto) // 2
    assert [s["run"] for s in result["summary"]] == ["automatic", "fixed"]
    printed = capsys.readouterr().out
    assert "median p90 wait" in printed and "$/s" in printed
    html = page.read_text()
    assert "<title>Automatic reserve</title>" in html and "priority TTFT p90 (s)" in html
