"""The check ``scripts/gpu_bench.sh`` runs first, here against simulated engines behind the real
smg: it passes when the bids arrive, and fails, naming the requests, when the route loses them."""

from __future__ import annotations

import json

from benchmarks.smg_check import bid_of, main
from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
from tests.openai_api.fake_engines import bid_dropping_route


def engine(rounds) -> ServerThread:
    return ServerThread(ServerOptions.of(port=0, speed=1.0, rounds_jsonl=str(rounds))).start()


def test_bids_through_the_gateway_to_two_engines_pass(tmp_path) -> None:
    rounds = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    engines = [engine(r) for r in rounds]
    try:
        argv = ["--requests", "6", "--json", str(tmp_path / "check.json")]
        for e, r in zip(engines, rounds, strict=True):
            argv += ["--engine-url", e.url, "--rounds-jsonl", str(r)]
        assert main(argv) == 0
    finally:
        for e in engines:
            e.stop()
    report = json.loads((tmp_path / "check.json").read_text())
    assert report["ok"] and report["failures"] == []
    sent = [r["bid"] for r in report["requests"]]
    assert sent == [bid_of(i) for i in range(6)] and len(set(sent)) == 6
    assert all(r["reported"] == r["recorded"] == r["bid"] for r in report["requests"])
    assert [r["streamed"] for r in report["requests"]] == [False, True] * 3


def test_a_route_that_loses_the_bid_fails_the_check(tmp_path, capsys) -> None:
    rounds = tmp_path / "a.jsonl"
    sim = engine(rounds)
    try:
        with bid_dropping_route(sim.url) as route:
            argv = ["--engine-url", route.url, "--rounds-jsonl", str(rounds), "--requests", "2"]
            assert main(argv) == 1
    finally:
        sim.stop()
    err = capsys.readouterr().err
    # Both requests: the engine read no bid (0.0), the first was sent 0.001 $/s.
    assert err.count("the answer reported 0.0") == 2 and "sent a bid of 0.001 $/s" in err
