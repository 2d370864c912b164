"""The policy benchmark against a live engine over HTTP, in real time: SGLang with our plugin on a
GPU (``scripts/gpu_bench.sh``), or the simulated engine's server.

    python -m benchmarks.live --engine-url http://127.0.0.1:30000 --policy lpm \\
        --requests 512 --rate 8 --json out/lpm.json
    python -m benchmarks.live --merge out/*.json --json table.json --html report.html

The first form drives one engine, already running under one policy, with the generated-shared-
prefix workload (token ids, so the engine needs no tokenizer: SGLang's --skip-tokenizer-init)
at Poisson arrivals, each request carrying its bid in ``custom_params``, through the project's
engine client, streaming so that TTFT is the first chunk's arrival. Priority revenue comes from
the engine's answers (the simulated engine reports each charge) or from the round records the
SGLang plugin wrote (``--rounds-jsonl``). The second form merges one file per policy into the
same table, JSON and report as the simulated benchmark (``python -m benchmarks``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from plotly.subplots import make_subplots

from engines.client import EngineClient, EngineError, EngineMeta, generate_body
from engines.contract.records import AdmittedRequest

from .bids import BidSpec
from .html import Section, Table, command_line, write_json, write_page
from .metrics import Served, summarize
from .report import from_json, policy_rows
from .workloads import BenchRequest, gsp


async def _one(
    client: EngineClient, url: str, req: BenchRequest, start: float
) -> tuple[Served, EngineMeta] | None:
    """Send one request at its arrival time: what it got (seconds from ``start``, its charge in
    dollars as the engine answered it) and the answer's figures; None when it failed."""
    await asyncio.sleep(max(0.0, start + req.arrival - time.monotonic()))
    sent = time.monotonic()
    body = generate_body(
        rid=req.id,
        max_new_tokens=req.max_new_tokens,
        bid=req.bid,
        input_ids=list(req.tokens),
        sampling_params={"temperature": 0.0, "ignore_eos": True},
        stream=True,
    )
    first = None
    meta = None
    try:
        async for chunk in client.generate_stream(base_url=url, body=body):
            if first is None:
                first = time.monotonic()
            meta = chunk.meta
    except EngineError as exc:
        print(f"  request {req.id} failed: {exc}", file=sys.stderr)
        return None
    done = time.monotonic()
    if meta is None or first is None:
        return None
    served = Served(
        req.id, req.bid, req.bid_class, sent - start, first - sent, done - sent, meta.charge or 0.0
    )
    return served, meta


def admitted(path: Path) -> list[AdmittedRequest]:
    """The requests admitted in a round-record file, in order (none when there is no file)."""
    if not path.exists():
        return []
    return [a for line in path.read_text().splitlines() for a in json.loads(line)["admitted"]]


async def drive(args: argparse.Namespace) -> dict[str, object]:
    """Run the workload against ``args.engine_url``; the policy's row and raw figures."""
    per_group = max(1, args.requests // args.groups)
    workload = gsp(
        num_groups=args.groups,
        prompts_per_group=per_group,
        system_prompt_len=args.system_len,
        question_len=args.question_len,
        output_len=args.output_len,
        bids=BidSpec(args.bids),
        seed=args.seed,
    ).at_rate(args.rate, args.seed)
    client = EngineClient(
        read_timeout_s=args.timeout, answer_timeout_s=args.timeout, max_connections=2048
    )
    start = time.monotonic()
    answers = await asyncio.gather(
        *(_one(client, args.engine_url, r, start) for r in workload.requests)
    )
    makespan = time.monotonic() - start
    await client.aclose()
    # The plugin's round records have the charges where SGLang's answers do not.
    rounds = admitted(Path(args.rounds_jsonl)) if args.rounds_jsonl else []
    charges = {a["request_id"]: a["charge"] for a in rounds}
    done = [a for a in answers if a is not None]
    served = [replace(s, charge=charges.get(s.id, s.charge)) for s, _ in done]
    metas = [m for _, m in done]
    hit = sum(m.cached_tokens for m in metas) / max(1, sum(m.prompt_tokens for m in metas))
    tokens = sum(m.prompt_tokens + m.completion_tokens for m in metas)
    metrics = summarize(served, makespan_s=makespan, tokens=tokens, cache_hit_rate=hit)
    return {
        "policy": args.policy,
        "metrics": metrics.as_dict(),
        "served": len(served),
        "requests": len(workload.requests),
        "title": workload.title + f"; {args.rate:g} req/s Poisson, live engine",
    }


def merge(paths: Sequence[str]) -> dict[str, object]:
    """One file per policy into ``{"policies": {name: row}}``, the simulated benchmark's schema."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    return {
        "policies": {r["policy"]: r["metrics"] for r in runs},
        "meta": {
            "title": runs[0]["title"] if runs else "",
            "served": {r["policy"]: f"{r['served']}/{r['requests']}" for r in runs},
        },
    }


def table(merged: dict[str, object]) -> str:
    """The simulated benchmark's policy table (report.policy_rows), ratios to lpm if it ran."""
    _, titles, rows = policy_rows(*from_json(merged["policies"]))
    return Table(titles, rows).text()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-url", default="http://127.0.0.1:30000")
    parser.add_argument("--policy", default="unknown", help="the policy the engine runs (label)")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--rate", type=float, default=8.0, help="arrivals per second")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--system-len", type=int, default=2048)
    parser.add_argument("--question-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--bids", default="two-class")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    parser.add_argument("--rounds-jsonl", help="the plugin's round records (for revenue)")
    parser.add_argument("--merge", nargs="+", help="merge these per-policy files instead")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--html", help="with --merge: a self-contained Plotly report")
    args = parser.parse_args(argv)
    if args.merge:
        out = merge(args.merge)
        print(out["meta"]["title"])
        print(table(out))
        if args.html:
            _bars(out, args.html, command_line("benchmarks.live", argv))
    else:
        out = asyncio.run(drive(args))
        print(json.dumps(out["metrics"], indent=2))
    if args.json:
        write_json(args.json, out)
    return 0


def _bars(merged: dict[str, object], path: str, command: str) -> None:
    """The table, and mean TTFT, cache hit rate and welfare per policy, one bar chart each."""
    names = list(merged["policies"])
    rows = merged["policies"]
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=("mean TTFT, s", "cache hit rate", "realized welfare, $")
    )
    for col, key in enumerate(("mean_ttft_s", "cache_hit_rate", "welfare"), start=1):
        fig.add_bar(x=names, y=[rows[n][key] for n in names], name=key, row=1, col=col)
    fig.update_layout(showlegend=False, height=450)
    section = Section("", table(merged), figures=[fig])
    write_page(path, merged["meta"]["title"], [section], command=command)


if __name__ == "__main__":
    sys.exit(main())
