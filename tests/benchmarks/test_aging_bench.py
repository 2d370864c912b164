"""The wait-bound benchmark (benchmarks.aging): the knob moves credits in the engine's rounds,
and the side-by-side table has every policy at every load."""

from __future__ import annotations

import pytest

from benchmarks.aging import main
from engines.contract.knobs import MarketKnobs
from engines.sim import Engine, EngineConfig, SimRequest


def test_the_bound_gives_credits_in_the_engines_rounds() -> None:
    # One cold request keeps the engine busy; the second waits. With a bound of 0.5 s in one
    # step, density $0.5/s per token and a 40-token prompt, it has $20/s of credit (2e10 ticks)
    # once a round runs 0.5 s or more after it arrived.
    knobs = MarketKnobs(wait_bound_s=0.5, wait_density=0.5, wait_steps=1)
    engine = Engine(EngineConfig(max_running_requests=1), "dfs-auction-density", knobs=knobs)
    engine.submit(SimRequest("busy", tuple(range(1000, 1400)), 200, 0.0, 0.0))
    engine.submit(SimRequest("late", tuple(range(40)), 4, 0.0, 0.0))
    credits = []
    now = 0.0
    while "late" in engine.waiting:
        res = engine.step(now)
        assert res is not None
        now = res.end
        if "late" in engine.tree.entries:
            credits.append(engine.tree.entries["late"].credit)
    assert credits[0] == 0 and credits[-1] == 20 * 10**9


def test_the_table_has_both_auctions_with_and_without_the_bound(capsys) -> None:
    argv = ["--loads", "1.2", "--chat-requests", "80", "--chat-conversations", "8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("  1.2 ")]
    names = [" ".join(r[1:3]) if r[2] == "+wait" else r[1] for r in rows]
    assert names == [
        "lpm", "dfs-weight", "highest-bid", "dfs-auction-density", "dfs-auction-kv-split",
        "dfs-auction-density +wait", "dfs-auction-kv-split +wait",
    ]  # fmt: skip
    assert rows[0][2:5] == ["x1.00", "x1.00", "x1.000"]
    assert "command: python -m benchmarks.aging --loads 1.2" in out


@pytest.mark.parametrize("bad", ["0", "x", "1,-2"])
def test_bad_loads_are_refused(bad, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--loads", bad])
    assert "loads" in capsys.readouterr().err
