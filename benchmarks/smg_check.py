"""Through SGLang's model gateway (smg) to the engines: do the bids arrive?

    python -m benchmarks.smg_check --engine-url http://127.0.0.1:30000 [--engine-url URL ...] \\
        [--rounds-jsonl PATH ...] [--requests 8] [--json OUT]

Starts smg in front of the engines (``engines.router``, the market's settings), sends
``--requests`` requests through it with the project's engine client (token ids, so that an
engine without a tokenizer takes them; each its own bid and the tenant's tag; every other one
streamed) and checks, for each:

- the answer came, and reports the bid sent (what the OpenAI gateway checks before it charges:
  SGLang took the body smg rebuilt, and the engine read the bid from it);
- with the engines' round-record files (``--rounds-jsonl``), a round admitted it under its own
  id with that bid.

``scripts/gpu_bench.sh`` runs it first against SGLang 0.5.23 with the market's plugin; the main
suite runs it against simulated engines. Prints one line per failure and a summary; exit status 0
when every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from benchmarks.html import write_json
from benchmarks.live import admitted
from engines.client import EngineClient, EngineError, generate_body
from engines.router import Router, RouterOptions, free_port

TENANT_TAG = "smg-check"
PROMPT_TOKENS = 32
MAX_NEW_TOKENS = 4


def bid_of(i: int) -> float:
    """Request ``i``'s bid, $/s: distinct, with more digits than a round number has."""
    return round(0.001 + i * 0.0370370370370371, 15)


def prompt_of(i: int) -> list[int]:
    """Request ``i``'s prompt: token ids in every vocabulary (1..1000), its own from the first."""
    return [1 + (i * 37 + j * 11) % 1000 for j in range(PROMPT_TOKENS)]


async def send_all(url: str, rids: list[str]) -> dict[str, float | str]:
    """Each request's reported bid ($/s), or what went wrong (text)."""
    client = EngineClient()
    out: dict[str, float | str] = {}
    try:
        for i, rid in enumerate(rids):
            stream = i % 2 == 1
            body = generate_body(
                rid=rid, max_new_tokens=MAX_NEW_TOKENS, bid=bid_of(i), input_ids=prompt_of(i),
                owner=TENANT_TAG, stream=stream,
            )  # fmt: skip
            try:
                if stream:
                    chunks = [c async for c in client.generate_stream(base_url=url, body=body)]
                    meta = chunks[0].meta if chunks else None
                else:
                    meta = (await client.generate(base_url=url, body=body)).meta
            except EngineError as exc:
                out[rid] = f"failed: {exc.message}"
                continue
            out[rid] = "no answer" if meta is None or meta.bid is None else meta.bid
    finally:
        await client.aclose()
    return out


def check(
    engine_urls: Sequence[str],
    *,
    requests: int,
    rounds: Sequence[Path] = (),
    log: Path | None = None,
    start_timeout_s: float = 120.0,
) -> dict:
    """Run the check; its report (``ok``, ``failures``, per request what was sent and read)."""
    run = uuid.uuid4().hex[:8]
    rids = [f"smg-check-{run}-{i}" for i in range(requests)]
    options = RouterOptions(port=free_port(), worker_urls=tuple(engine_urls))
    front = Router(options, log=log)
    try:
        front.start(timeout_s=start_timeout_s)
        reported = asyncio.run(send_all(front.url, rids))
    finally:
        front.stop()
    time.sleep(0.5)  # the last round records reach their files
    # Request id -> the bid its admitting round recorded.
    recorded = {a["request_id"]: a["bid"] for path in rounds for a in admitted(path)}
    failures = []
    for i, rid in enumerate(rids):
        sent, got = bid_of(i), reported.get(rid)
        if got != sent:
            failures.append(f"{rid}: sent a bid of {sent!r} $/s, the answer reported {got!r}")
        if rounds and recorded.get(rid) != sent:
            failures.append(
                f"{rid}: sent a bid of {sent!r} $/s, the round records have {recorded.get(rid)!r}"
            )
    return {
        "ok": not failures,
        "failures": failures,
        "engines": list(engine_urls),
        "requests": [
            {
                "rid": rid,
                "bid": bid_of(i),
                "streamed": i % 2 == 1,
                "reported": reported.get(rid),
                "recorded": recorded.get(rid),
            }
            for i, rid in enumerate(rids)
        ],  # fmt: skip
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.smg_check", description=__doc__)
    p.add_argument("--engine-url", action="append", required=True, help="an engine (repeat)")
    p.add_argument("--rounds-jsonl", action="append", type=Path, default=[],
                   help="an engine's round-record file (repeat)")  # fmt: skip
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--log", type=Path, help="the gateway's log")
    args = p.parse_args(argv)
    if args.requests < 1:
        p.error("--requests must be at least 1")
    report = check(args.engine_url, requests=args.requests, rounds=args.rounds_jsonl, log=args.log)
    if args.json:
        write_json(args.json, report)
    for failure in report["failures"]:
        print(failure, file=sys.stderr)
    n = len(report["requests"])
    print(
        f"smg check: {n - len({f.split(':')[0] for f in report['failures']})} of {n} requests "
        f"reached {len(args.engine_url)} engine(s) through the gateway with their bids"
    )
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
