"""Several simulated engines in one process (``engines.sim.many``) behind the real smg 1.13.0
under its ``prefix_hash`` policy: smg sees every engine as a worker of its own, each request's
first tokens pick its replica (every request of a prefix on one replica), and the bids arrive
unchanged. No mock: the engines' process and the gateway are the ones the fleet benchmark runs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from engines.client import EngineClient, generate_body
from engines.router import Router, RouterOptions, free_ports, http_wait

PREFIX_TOKENS = 32  # what prefix_hash hashes (--prefix-token-count)


def admitted_by(rounds_dir: Path) -> dict[str, dict[str, float]]:
    """Engine id -> request id -> the bid its round records admitted it with."""
    out: dict[str, dict[str, float]] = {}
    for path in sorted(rounds_dir.glob("*.jsonl")):
        out[path.stem] = {
            a["request_id"]: a["bid"]
            for line in path.read_text().splitlines()
            for a in json.loads(line)["admitted"]
        }
    return out


def test_one_process_serves_four_workers_and_prefix_hash_keeps_each_prefix_on_one(
    tmp_path: Path,
) -> None:
    *ports, front_port, metrics_port = free_ports(6)
    argv = [sys.executable, "-m", "engines.sim.many", "--rounds-dir", str(tmp_path),
            "--log-level", "WARNING"]  # fmt: skip
    for port in ports:
        argv += ["--port", str(port)]
    engines = subprocess.Popen(argv)
    urls = tuple(f"http://127.0.0.1:{p}" for p in ports)
    try:
        for url in urls:
            http_wait(f"{url}/health", engines, timeout_s=30.0)
        # Each engine names itself: rep-0 .. rep-3, in the order of the ports.
        for i, url in enumerate(urls):
            with urllib.request.urlopen(f"{url}/server_info", timeout=5) as answer:
                assert json.load(answer)["engine_id"] == f"rep-{i}"
        options = RouterOptions(
            port=front_port, prometheus_port=metrics_port, worker_urls=urls,
            policy="prefix_hash", prefix_token_count=PREFIX_TOKENS,
        )  # fmt: skip
        with Router(options) as front:  # waits until smg has the four workers healthy
            sent = asyncio.run(send_prefixes(front.url))
    finally:
        engines.terminate()
        engines.wait(timeout=10)
    seen = admitted_by(tmp_path)
    assert set(seen) <= {"rep-0", "rep-1", "rep-2", "rep-3"}  # a file once an engine admits
    everywhere = {rid: bid for per in seen.values() for rid, bid in per.items()}
    assert everywhere == sent  # each request admitted once, with the bid it was sent with
    for prefix in range(6):
        holders = {e for e, per in seen.items() if any(r.startswith(f"p{prefix}-") for r in per)}
        assert len(holders) == 1, (prefix, holders)


async def send_prefixes(url: str) -> dict[str, float]:
    """Six prefixes of ``PREFIX_TOKENS`` tokens, each with three requests that differ after it,
    sent one at a time (no load to balance); request id -> bid sent."""
    client = EngineClient()
    sent = {}
    try:
        for k in range(3):
            for prefix in range(6):
                rid = f"p{prefix}-{k}"
                head = [1 + (prefix * 97 + j * 13) % 997 for j in range(PREFIX_TOKENS)]
                tail = [1 + (k * 31 + j) % 997 for j in range(8)]
                bid = round(0.01 * (prefix + 1) + 0.001 * k, 6)
                body = generate_body(rid=rid, max_new_tokens=2, bid=bid, input_ids=head + tail)
                out = await client.generate(base_url=url, body=body)
                assert out.meta.bid == bid
                sent[rid] = bid
    finally:
        await client.aclose()
    return sent
