"""``python -m benchmarks``: the policies side by side on the simulated engine.

    python -m benchmarks                         # gsp 256 x 8, load 1.5, every policy
    python -m benchmarks --load 0.5,0.9,1.5 --html report.html
    python -m benchmarks --workload agents --policies lpm,dfs-auction
    python -m benchmarks --trace requests.jsonl --time-scale 0.5
    python -m benchmarks --sweep --json sweep.json --html sweep.html

Every policy runs on a fresh engine over the same arrivals, in virtual time. Load is a fraction
of the engine's measured capacity on the workload (runner.py says how it is measured).

The default run is one where the policies differ: 256 system prompts of 2048 tokens (524k
tokens, more than the engine's 400k of KV cache) with 8 requests each, at 1.5 x capacity, so a
queue forms and prefixes are evicted while requests still wait for them.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence

from engines.contract.knobs import MarketKnobs
from engines.sim import settings_split
from mechanism import POLICIES
from mechanism.aging import wait_bound_checked
from mechanism.wait_bound import AUTO, MULTIPLE, OFF

from . import figures
from .bids import BID_DISTRIBUTIONS, BidSpec
from .goal import point_goals
from .html import arguments, command_line, write_json
from .options import floats, ints, positive
from .progress import Progress
from .report import findings_table, goal_table, policy_table
from .runner import Capacities, Point, run_point
from .sweep import (
    DEFAULT_GROUPS,
    DEFAULT_KV_CAPACITIES,
    DEFAULT_LOADS,
    DEFAULT_REQUESTS,
    GOAL_POLICIES,
    SweepPoint,
    run_sweep,
    sweep_requests,
)
from .trace import load_trace
from .workloads import Workload, agents, chat, gsp, nosharing


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run the market's ordering policies side by side on the simulated engine.",
    )
    src = p.add_argument_group("workload")
    src.add_argument("--workload", choices=tuple(WORKLOADS), default="gsp")
    src.add_argument("--trace", metavar="FILE.jsonl", help="replay a trace instead")
    src.add_argument("--time-scale", type=float, default=1.0, help="multiplies trace arrivals")
    src.add_argument("--seed", type=int, default=0)
    src.add_argument(
        "--load",
        type=floats,
        default=None,
        help="arrival rate as a fraction of measured capacity; a list runs each (default 1.5)",
    )
    g = p.add_argument_group("gsp (SGLang bench_serving generated-shared-prefix)")
    g.add_argument("--gsp-num-groups", type=int, default=256)
    g.add_argument("--gsp-prompts-per-group", type=int, default=8)
    g.add_argument("--gsp-system-prompt-len", type=int, default=2048)
    g.add_argument("--gsp-question-len", type=int, default=128)
    g.add_argument("--gsp-output-len", type=int, default=256)
    g.add_argument("--gsp-popularity", choices=("uniform", "zipf"), default="uniform")
    g.add_argument("--gsp-zipf-s", type=float, default=1.0)
    a = p.add_argument_group("agents (closed-loop multi-turn sessions)")
    a.add_argument("--agents-sessions", type=int, default=64)
    a.add_argument("--agents-turns", type=int, default=8)
    a.add_argument("--agents-prefix-len", type=int, default=2048)
    a.add_argument("--agents-message-len", type=int, default=128)
    a.add_argument("--agents-output-len", type=int, default=256)
    a.add_argument("--agents-think-s", type=float, default=2.0, help="mean think time")
    n = p.add_argument_group("nosharing")
    n.add_argument("--nosharing-requests", dest="nosharing_num_requests", type=int, default=1024)
    n.add_argument("--nosharing-prompt-len", type=int, default=2176)
    n.add_argument("--nosharing-output-len", type=int, default=256)
    c = p.add_argument_group("chat (heavy-tailed prompts branching from one system prompt)")
    c.add_argument("--chat-requests", dest="chat_num_requests", type=int, default=1024)
    c.add_argument("--chat-conversations", type=int, default=256)
    c.add_argument("--chat-system-prompt-len", type=int, default=64, help="tokens")
    c.add_argument("--chat-median-len", type=int, default=256, help="median prompt, tokens")
    c.add_argument("--chat-sigma", type=float, default=1.25, help="lognormal sigma of lengths")
    c.add_argument("--chat-output-len", type=int, default=128, help="tokens")
    b = p.add_argument_group("bids ($ per second of waiting)")
    b.add_argument("--bids", choices=BID_DISTRIBUTIONS, default="two-class")
    b.add_argument("--bid-value", type=float, default=0.1, help="constant")
    b.add_argument("--bid-low", type=float, default=0.0, help="uniform")
    b.add_argument("--bid-high", type=float, default=1.0, help="uniform")
    b.add_argument("--bid-mu", type=float, default=-1.0, help="lognormal")
    b.add_argument("--bid-sigma", type=float, default=1.0, help="lognormal")
    m = p.add_argument_group("market and engine")
    m.add_argument("--policies", default=",".join(POLICIES), help="comma-separated")
    m.add_argument("--reserve", type=float, default=0.0, help="reserve price, $/s")
    m.add_argument(
        "--wait-bound",
        type=wait_bound_option,
        default=AUTO,
        metavar="auto|off|SECONDS",
        help="the market's wait bound: automatic (the product's default, mechanism.wait_bound), "
        "off, or pinned to SECONDS",
    )
    m.add_argument(
        "--wait-multiple",
        type=positive,
        default=MULTIPLE,
        metavar="X",
        help="the automatic bound's multiple of the mean wait (default: the product's, "
        "mechanism.wait_bound.MULTIPLE)",
    )
    m.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="EngineConfig or MarketKnobs override",
    )
    s = p.add_argument_group("sweep (gsp: KV capacity x sharing x load, total requests fixed)")
    s.add_argument("--sweep", action="store_true")
    s.add_argument("--sweep-loads", type=floats, default=DEFAULT_LOADS)
    s.add_argument("--sweep-groups", type=ints, default=DEFAULT_GROUPS)
    s.add_argument("--sweep-requests", type=int, default=DEFAULT_REQUESTS)
    s.add_argument(
        "--sweep-kv",
        type=ints,
        default=DEFAULT_KV_CAPACITIES,
        metavar="TOKENS",
        help="KV cache capacities (tokens), comma-separated; replaces kv_capacity_tokens",
    )
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="OUT", help="write the metrics as JSON")
    o.add_argument("--html", metavar="OUT", help="write a self-contained Plotly report")
    o.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    return p


def wait_bound_option(text: str) -> str | float:
    """``--wait-bound``: "auto", "off" (0 s) or a pinned bound in seconds (0.5..3600)."""
    if text in (AUTO, OFF):
        return text
    try:
        return wait_bound_checked(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"auto, off or {exc}") from None


# Each generated workload and the prefix of its options: ``--gsp-zipf-s`` is gsp's ``zipf_s``.
WORKLOADS: dict[str, Callable[..., Workload]] = {
    "gsp": gsp,
    "agents": agents,
    "nosharing": nosharing,
    "chat": chat,
}


def _generated(args: argparse.Namespace, name: str, bids: BidSpec, **given: int) -> Workload:
    """Workload ``name`` from its ``--NAME-*`` options, ``given`` overriding some of them."""
    prefix = f"{name}_"
    options = {k.removeprefix(prefix): v for k, v in vars(args).items() if k.startswith(prefix)}
    return WORKLOADS[name](**{**options, **given}, bids=bids, seed=args.seed)


def _point_json(point: Point) -> dict[str, object]:
    return {
        "load": point.load,
        "capacity_rps": point.capacity_rps,
        "rate_rps": point.rate_rps,
        "requests": point.workload.requests_total,
        "policies": {name: run.metrics.as_dict() for name, run in point.runs.items()},
        "wait_bounds_s": {n: r.wait_bounds_s for n, r in point.runs.items() if r.wait_bounds_s},
        "goals": {name: g.as_dict() for name, g in point_goals(point).items()},
    }


def to_json(
    main: list[Point], sweep: list[SweepPoint] | None, meta: dict[str, object]
) -> dict[str, object]:
    """The ``--json`` document: ``policies`` of the (first) main run, plus ``meta``, ``sweep``."""
    first = main[0]
    meta = {
        **meta,
        "workload": first.workload.title,
        "requests": first.workload.requests_total,
        "load": first.load,
        "capacity_rps": first.capacity_rps,
        "rate_rps": first.rate_rps,
        "runs": {
            name: {"wall_s": r.wall_s, "makespan_s": r.makespan_s, "steps": r.steps}
            for name, r in first.runs.items()
        },
    }
    point = _point_json(first)
    doc: dict[str, object] = {"meta": meta, "policies": point["policies"], "goals": point["goals"]}
    extra: dict[str, object] = {}
    if len(main) > 1:
        extra["loads"] = [_point_json(p) for p in main]
    if sweep:
        extra["grid"] = [
            {
                **_point_json(sp.point),
                "kv_capacity_tokens": sp.kv_capacity_tokens,
                "groups": sp.groups,
                "prompts_per_group": sp.prompts_per_group,
                "findings": sp.findings.as_dict(),
            }
            for sp in sweep
        ]
    if extra:
        doc["sweep"] = extra
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    unknown = [x for x in policies if x not in POLICIES]
    if unknown or not policies:
        parser.error(f"unknown policy {unknown}; choose from {', '.join(POLICIES)}")
    if args.trace and args.load is not None:
        parser.error("--load does not apply to a trace (its arrivals are given); use --time-scale")
    if args.sweep and (args.trace or args.workload != "gsp"):
        parser.error("--sweep runs on the gsp workload only")
    if args.sweep and any(p not in policies for p in GOAL_POLICIES):
        parser.error(f"--sweep needs the policies {', '.join(GOAL_POLICIES)}")
    try:
        pinned = 0.0 if args.wait_bound in (AUTO, OFF) else args.wait_bound
        config, knobs = settings_split(
            args.set, MarketKnobs(reserve=args.reserve, wait_bound_s=pinned)
        )
        if any(item.partition("=")[0].strip() == "wait_bound_s" for item in args.set):
            args.wait_bound = knobs.wait_bound_s or OFF  # --set wait_bound_s=S pins it as well
        bids = BidSpec(
            args.bids, args.bid_value, args.bid_low, args.bid_high, args.bid_mu, args.bid_sigma
        )
        workload = (
            load_trace(args.trace, time_scale=args.time_scale, seed=args.seed)
            if args.trace
            else _generated(args, args.workload, bids)
        )
    except (ValueError, OSError) as exc:  # TraceError is a ValueError
        parser.error(str(exc))
    multiple = args.wait_multiple if args.wait_bound == AUTO else None
    loads: tuple[float | None, ...] = (None,) if args.trace else (args.load or (1.5,))
    total = len(loads) * len(policies) * workload.requests_total
    if args.sweep:
        total += (
            len(args.sweep_kv)
            * len(args.sweep_loads)
            * len(policies)
            * sweep_requests(args.sweep_groups, args.sweep_requests)
        )
    enabled = sys.stderr.isatty() if args.progress is None else args.progress
    progress = Progress(total, enabled=enabled)
    capacities = Capacities()
    main_points: list[Point] = []
    sweep_points: list[SweepPoint] | None = None
    try:
        for load in loads:

            def label(policy: str, load: float | None = load) -> None:
                progress.set_label(policy if load is None else f"load {load:g} {policy}")

            main_points.append(
                run_point(
                    workload,
                    policies,
                    config,
                    knobs=knobs,
                    load=load,
                    seed=args.seed,
                    capacities=capacities,
                    on_served=progress.advance,
                    on_policy=label,
                    wait_multiple=multiple,
                )
            )
        if args.sweep:
            sweep_points = run_sweep(
                lambda g, per_group: _generated(
                    args, "gsp", bids, num_groups=g, prompts_per_group=per_group
                ),
                policies,
                config,
                loads=args.sweep_loads,
                groups=args.sweep_groups,
                requests=args.sweep_requests,
                kv_capacities=args.sweep_kv,
                knobs=knobs,
                seed=args.seed,
                capacities=capacities,
                on_served=progress.advance,
                on_policy=progress.set_label,
                wait_multiple=multiple,
            )
    except ValueError as exc:  # a request the engine refuses (too long for the KV cache, ...)
        progress.close()
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    progress.close()
    tables = [policy_table(p) for p in main_points]
    print("\n\n".join(tables))
    findings = None
    if sweep_points:
        findings = findings_table(sweep_points) + "\n\n" + goal_table(sweep_points)
        print()
        print(findings)
    if args.json:
        meta = {
            "seed": args.seed,
            "bids": dataclasses.asdict(bids) if not args.trace else "from the trace",
            "reserve": args.reserve,
            "engine": dataclasses.asdict(config),
            "market_knobs": dataclasses.asdict(knobs),
            "wait_bound": args.wait_bound,
            "wait_multiple": multiple,
            "argv": arguments(argv),
        }
        write_json(args.json, to_json(main_points, sweep_points, meta))
    if args.html:
        command = command_line("benchmarks", argv)
        figures.write_report(args.html, main_points, tables, sweep_points, findings, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
