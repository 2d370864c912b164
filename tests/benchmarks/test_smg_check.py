"""The check ``scripts/gpu_bench.sh`` runs first, here against simulated engines behind the real
smg: it passes when the bids arrive, and fails, naming the requests, when the route loses them."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks.smg_check import bid_of, main
from engines.router import free_ports, http_wait
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


def test_bids_through_the_gateway_to_eight_engines_in_one_process_pass(tmp_path) -> None:
    # The fleet benchmark's set-up at its smallest size: eight engines served by one process
    # (engines.sim.many), each its own worker for smg, under the market's routing.
    ports = free_ports(8)
    argv = [sys.executable, "-m", "engines.sim.many", "--rounds-dir", str(tmp_path),
            "--log-level", "WARNING"]  # fmt: skip
    for port in ports:
        argv += ["--port", str(port)]
    served = subprocess.Popen(argv)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url in urls:
            http_wait(f"{url}/health", served, timeout_s=30.0)
        check = ["--requests", "16", "--json", str(tmp_path / "check.json")]
        for i, url in enumerate(urls):
            check += ["--engine-url", url, "--rounds-jsonl", str(tmp_path / f"rep-{i}.jsonl")]
        assert main(check) == 0
    finally:
        served.terminate()
        served.wait(timeout=10)
    report = json.loads((tmp_path / "check.json").read_text())
    assert report["ok"] and report["failures"] == []
    assert [r["bid"] for r in report["requests"]] == [bid_of(i) for i in range(16)]
    assert all(r["reported"] == r["recorded"] == r["bid"] for r in report["requests"])
    # Sixteen prompts, each its own from the first token: the market's routing spreads them.
    assert len(list(tmp_path.glob("rep-*.jsonl"))) >= 2
