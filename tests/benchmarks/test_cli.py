"""The command line: the --json schema, the self-contained --html report, the sweep."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.__main__ import main
from mechanism import POLICIES
from mechanism.wait_bound import MULTIPLE

# ~48 small requests: 4 groups x 12 over a 256-token system prompt
TINY = [
    "--gsp-num-groups", "4", "--gsp-prompts-per-group", "12", "--gsp-system-prompt-len", "256",
    "--gsp-question-len", "32", "--gsp-output-len", "16",
]  # fmt: skip
KEYS = {
    "mean_ttft_s",
    "p50_ttft_s",
    "p99_ttft_s",
    "mean_e2e_s",
    "cache_hit_rate",
    "throughput_tokens_per_s",
    "welfare",
    "revenue",
    "recomputed_prefix_tokens",
}


def test_json_schema_of_a_tiny_run(tmp_path, capsys) -> None:
    out = tmp_path / "out.json"
    assert main([*TINY, "--load", "0.9", "--json", str(out), "--set", "step_fixed_s=0.005"]) == 0
    doc = json.loads(out.read_text())
    assert set(doc) == {"meta", "policies", "goals"}
    assert list(doc["policies"]) == list(POLICIES)
    for metrics in doc["policies"].values():
        assert set(metrics) == KEYS
        counted = metrics.pop("recomputed_prefix_tokens")  # tokens, a count
        assert isinstance(counted, int) and counted >= 0
        assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
        assert metrics["welfare"] < 0 and 0 <= metrics["cache_hit_rate"] <= 1
        assert metrics["p50_ttft_s"] <= metrics["p99_ttft_s"] <= metrics["mean_e2e_s"] * 50
    for bid_blind in ("fcfs", "lpm", "dfs-weight"):
        assert doc["policies"][bid_blind]["revenue"] == 0.0
    assert doc["meta"]["requests"] == 48
    assert doc["meta"]["engine"]["step_fixed_s"] == 0.005
    assert (doc["meta"]["wait_bound"], doc["meta"]["wait_multiple"]) == ("auto", MULTIPLE)
    assert doc["meta"]["rate_rps"] == pytest.approx(0.9 * doc["meta"]["capacity_rps"])
    table = capsys.readouterr().out
    assert table.count("\n") >= 8 and "x1.00" in table and "dfs-auction-density" in table


def test_same_seed_same_numbers(tmp_path) -> None:
    docs = []
    for name in ("a.json", "b.json"):
        main([*TINY, "--policies", "highest-bid", "--seed", "3", "--json", str(tmp_path / name)])
        docs.append(json.loads((tmp_path / name).read_text())["policies"])
    assert docs[0] == docs[1]


def test_html_report_is_self_contained(tmp_path) -> None:
    out = tmp_path / "r.html"
    args = [*TINY, "--policies", "lpm,highest-bid", "--load", "0.5,1.2", "--html", str(out)]
    assert main(args) == 0
    page = out.read_text()
    assert "<script src=" not in page  # nothing loaded from elsewhere, no CDN
    assert "* plotly.js v" in page  # the library itself is inline
    assert "Produced by <code>python -m benchmarks --gsp-num-groups 4 " in page  # its command
    assert page.count("Plotly.newPlot") >= 4
    for title in ("TTFT CDF", "Welfare and cache hits", "Latency by bid class", "Against load"):
        assert title in page


def test_a_sweep_of_the_goals_baselines_and_one_auction_checks_the_goal_alone(tmp_path) -> None:
    """The smallest sweep that answers the goal: lpm, dfs-weight and highest-bid beside the
    policy checked; the paper's comparisons, which need dfs-auction and dfs-auction-density,
    are left empty (null)."""
    out = tmp_path / "s.json"
    args = [
        *TINY, "--sweep", "--sweep-loads", "1.5", "--sweep-groups", "2", "--sweep-kv", "400000",
        "--sweep-requests", "24", "--policies", "lpm,dfs-weight,highest-bid,dfs-auction-kv-split",
        "--json", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    (point,) = json.loads(out.read_text())["sweep"]["grid"]
    f = point["findings"]
    assert f["hit_gap_pp"] is None and f["density_ttft_vs_dfs"] is None
    assert f["hb_ttft_vs_lpm"] == pytest.approx(
        point["policies"]["highest-bid"]["mean_ttft_s"] / point["policies"]["lpm"]["mean_ttft_s"]
    )
    assert set(f["goals"]) == {"dfs-auction-kv-split"} == set(point["goals"])


def test_sweep_findings(tmp_path, capsys) -> None:
    out = tmp_path / "s.json"
    html = tmp_path / "s.html"
    args = [
        *TINY, "--sweep", "--sweep-loads", "0.8,1.5", "--sweep-groups", "2,4",
        "--sweep-requests", "24", "--json", str(out), "--html", str(html),
    ]  # fmt: skip
    assert main(args) == 0
    doc = json.loads(out.read_text())
    grid = doc["sweep"]["grid"]
    assert [(p["kv_capacity_tokens"], p["groups"], p["load"]) for p in grid] == [
        (kv, g, load) for kv in (400_000, 100_000) for g in (2, 4) for load in (0.8, 1.5)
    ]
    assert all(p["requests"] == 24 for p in grid)
    for p in grid:
        f, pol = p["findings"], p["policies"]
        assert f["hb_ttft_vs_lpm"] == pytest.approx(
            pol["highest-bid"]["mean_ttft_s"] / pol["lpm"]["mean_ttft_s"]
        )
        best_hit = max(pol["lpm"]["cache_hit_rate"], pol["dfs-weight"]["cache_hit_rate"])
        assert f["hit_gap_pp"] == pytest.approx(
            100 * (pol["dfs-auction"]["cache_hit_rate"] - best_hit)
        )
        assert len(f["holds"]) == 3
        # The goal's figures, worked out again from the policies' metrics.
        lpm, hb = pol["lpm"], pol["highest-bid"]
        best_ttft = min(lpm["mean_ttft_s"], pol["dfs-weight"]["mean_ttft_s"])
        assert set(f["goals"]) == {
            "dfs-auction",
            "dfs-auction-density",
            "dfs-auction-kv",
            "dfs-auction-kv-split",
        }
        assert f["goals"] == p["goals"]
        for name, g in f["goals"].items():
            m = pol[name]
            assert g["hit_gap_pp"] == pytest.approx(
                100 * (m["cache_hit_rate"] - lpm["cache_hit_rate"])
            )
            assert g["ttft_vs_best"] == pytest.approx(m["mean_ttft_s"] / best_ttft)
            assert g["hit_ok"] == (g["hit_gap_pp"] >= -1.0)
            assert g["ttft_ok"] == (g["ttft_vs_best"] <= 1.05)
            assert g["tail_vs_lpm"] == pytest.approx(m["p99_ttft_s"] / lpm["p99_ttft_s"])
            assert g["tail_ok"] == (g["tail_vs_lpm"] <= 1.25)
            gain = hb["welfare"] - lpm["welfare"]
            if gain > 0.01 * abs(lpm["welfare"]):
                assert g["capture"] == pytest.approx((m["welfare"] - lpm["welfare"]) / gain)
                assert g["capture_ok"] == (g["capture"] >= 0.8)
            else:
                assert g["capture"] is None and g["capture_ok"] is None
    printed = capsys.readouterr().out
    assert "findings:" in printed and "hb/lpm TTFT" in printed
    assert "goal met on" in printed and "hit/ttft/cap/p99" in printed
    page = html.read_text()
    assert "Against sharing" in page and "TTFT ratio vs welfare capture" in page


@pytest.mark.parametrize("workload", ["agents", "nosharing", "chat"])
def test_other_workloads_run(workload, tmp_path) -> None:
    out = tmp_path / "o.json"
    small = {
        "agents": ["--agents-sessions", "6", "--agents-turns", "3", "--agents-prefix-len", "128",
                   "--agents-message-len", "16", "--agents-output-len", "8"],
        "nosharing": ["--nosharing-requests", "30", "--nosharing-prompt-len", "64",
                      "--nosharing-output-len", "8"],
        "chat": ["--chat-requests", "30", "--chat-conversations", "3",
                 "--chat-system-prompt-len", "400", "--chat-median-len", "480",
                 "--chat-output-len", "8"],
    }[workload]  # fmt: skip
    assert main(["--workload", workload, *small, "--json", str(out), "--bids", "uniform"]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["requests"] == (18 if workload == "agents" else 30)
    hits = {p: m["cache_hit_rate"] for p, m in doc["policies"].items()}
    if workload == "nosharing":
        assert max(hits.values()) < 0.05
    else:
        assert min(hits.values()) > 0.5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "lpm,best"], "unknown policy"),
        (["--set", "warp=9"], "unknown engine setting"),
        (["--load", "0"], "positive"),
        (["--sweep", "--policies", "lpm"], "--sweep needs"),
        (["--workload", "agents", "--sweep"], "gsp workload only"),
        (["--set", "kv_capacity_tokens=200"], "more than the cache"),
        (["--wait-multiple", "0"], "--wait-multiple: expected positive number: '0'"),
        (["--wait-multiple", "6,8"], "--wait-multiple: expected one positive number: '6,8'"),
    ],
)
def test_bad_arguments_exit_2(args, message, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main([*TINY[:4], *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
