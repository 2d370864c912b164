"""The replicas benchmark runs end to end (two engines behind the real gateway, and the one
engine of the same capacity), and its parts compute what they say."""

from __future__ import annotations

import argparse
import json
import re

from benchmarks.replicas import (
    SINGLE,
    config_settings,
    main,
    scaled,
    setups,
    shared_prefix_workload,
)
from engines.contract.knobs import MarketKnobs
from engines.router import RouterOptions, router_argv
from engines.sim import EngineConfig
from engines.sim.config import settings_split


def test_the_baseline_engine_is_n_times_as_fast_and_as_large() -> None:
    base = EngineConfig(kv_capacity_tokens=1000, max_running_requests=8)
    four = scaled(base, 4)
    assert four.prefill_token_s == base.prefill_token_s / 4
    assert four.step_fixed_s == base.step_fixed_s / 4
    assert (four.kv_capacity_tokens, four.max_running_requests) == (4000, 32)
    # The command line gives the engine exactly that config.
    config, _ = settings_split(config_settings(four), MarketKnobs())
    assert config == four


def test_the_workload_shares_prefixes_within_a_group() -> None:
    reqs = shared_prefix_workload(
        groups=3, requests=30, system_words=5, question_words=2, output_len=4, seed=1
    )
    by_group: dict[str, set[str]] = {}
    for r in reqs:
        by_group.setdefault(r.id.split("-")[0], set()).add(" ".join(r.text.split()[:5]))
    assert all(len(heads) == 1 for heads in by_group.values())  # one system prompt per group
    assert len({next(iter(h)) for h in by_group.values()}) == len(by_group)


def test_a_small_run_writes_rows_for_the_gateway_and_the_baseline(tmp_path) -> None:
    out, html = tmp_path / "r.json", tmp_path / "r.html"
    argv = [
        "--replicas", "2", "--loads", "1.0", "--policies", "round_robin", "--requests", "30",
        "--engine-rps", "10", "--json", str(out), "--html", str(html), "--no-progress",
    ]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["replicas"], r["policy"]) for r in rows] == [(2, "round_robin"), (2, SINGLE)]
    routed, single = rows
    assert routed["failed"] == single["failed"] == 0
    assert routed["merged"]["requests"] == single["merged"]["requests"] == 30
    # Round robin spreads 30 requests over both replicas, 15 each.
    assert [v["requests"] for v in routed["per_replica"].values()] == [15, 15]
    assert list(single["per_replica"]) == ["rep-0"]
    page = html.read_text()
    assert "* plotly.js v" in page and "<script src=" not in page  # inline, no CDN
    assert "python -m benchmarks.replicas --replicas 2" in page  # the command that made it
    # The table's rows: the setup, then the load.
    assert re.search(r"2x round_robin +1 ", page) and re.search(r"2x one engine +1 ", page)


def test_the_variants_set_smgs_defaults_or_open_the_balance_gate() -> None:
    args = argparse.Namespace(
        replicas=[1, 2], loads=[1.0], policies=["cache_aware", "round_robin"],
        variants=["smg", "open"], tune=False,
    )  # fmt: skip
    plan = setups(args)
    assert [(s.replicas, s.policy, s.variant) for s in plan] == [
        (1, "cache_aware", ""), (1, SINGLE, ""), (2, "cache_aware", ""), (2, "round_robin", ""),
        (2, "cache_aware", "smg"), (2, "cache_aware", "open"), (2, SINGLE, ""),
    ]  # fmt: skip
    assert [s.label for s in plan[4:6]] == ["2x cache_aware/smg @ 1", "2x cache_aware/open @ 1"]

    def argv_of(setup):
        return router_argv(RouterOptions(port=1, worker_urls=("http://127.0.0.1:2",),
                                         **setup.thresholds))  # fmt: skip

    market, smg, opened = argv_of(plan[2]), argv_of(plan[4]), argv_of(plan[5])
    # The market's: smg's balance gate, its overload protection off; "smg": all smg's own.
    assert "--disable-worker-overload-protection" in market
    assert "--balance-abs-threshold" not in market + smg
    assert "--disable-worker-overload-protection" not in smg
    assert opened[opened.index("--balance-abs-threshold") + 1] == "100000"
    assert opened[opened.index("--balance-rel-threshold") + 1] == "1000.0"
    assert "--disable-worker-overload-protection" in opened
