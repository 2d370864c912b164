"""The live benchmark driver against the simulated engine's real HTTP server."""

import json

from benchmarks import live
from benchmarks.metrics import METRIC_KEYS
from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions


def test_drive_two_policies_and_merge(tmp_path):
    outs = []
    for policy in ("lpm", "dfs-auction-density"):
        with ServerThread(ServerOptions.of(port=0, speed=50, policy=policy)) as sim:
            out = tmp_path / f"{policy}.json"
            args = [
                "--engine-url",
                sim.url,
                "--policy",
                policy,
                "--requests",
                "24",
                "--rate",
                "60",
                "--groups",
                "4",
                "--system-len",
                "64",
                "--question-len",
                "8",
                "--output-len",
                "4",
                "--json",
                str(out),
            ]
            assert live.main(args) == 0
            outs.append(out)
        run = json.loads(out.read_text())
        assert run["served"] == run["requests"] == 24
        assert set(run["metrics"]) == set(METRIC_KEYS)
        # 4 groups of 64 shared tokens: after each group's first request, later ones hit.
        assert 0 < run["metrics"]["cache_hit_rate"] < 1
    merged = tmp_path / "all.json"
    html = tmp_path / "r.html"
    assert live.main(["--merge", *map(str, outs), "--json", str(merged), "--html", str(html)]) == 0
    table = json.loads(merged.read_text())
    assert list(table["policies"]) == ["lpm", "dfs-auction-density"]
    page = html.read_text()
    assert "* plotly.js v" in page and "<script src=" not in page  # inline, no CDN
    assert "lpm" in page and "dfs-auction-density" in page and "mean TTFT, s" in page
