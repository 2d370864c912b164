"""``python -m benchmarks.holds``: what holds sized to a request's likely cost buy tenants, and
what they cost the market, against worst-case holds, side by side in one run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/market \\
        python -m benchmarks.holds --json var/bench/holds.json --html var/bench/holds.html

Bursts at a budget's edge: a tenant with a small monthly budget sends bursts of concurrent chat
completions with bids drawn log-uniformly from ``--bids`` ($/s), through the gateway's own
request flow (admission, the engine client, settlement, in this process) to a simulated engine
as small as the demo's (4 requests running, a 30 ms decode step), until the budget refuses a
whole burst. Each prompt shares a system prefix with the others and has a suffix of its own, so
requests queue behind each other and are charged for the delay they impose. The same bursts (one
seed) run twice, on two markets of the same engine:

- **worst case**: every request holds its consent cap, bid x ``max_wait_s`` (the old rule: the
  market's hold horizon pinned at ``max_wait_s``);
- **sized**: it holds bid x the market's hold horizon (``accounts.rules.hold_horizon_s``),
  renewed from the market's charges after every burst, as the periodic step does; with the
  rule's margin and floor, and with the alternatives ``--sized MARGIN:FLOOR,...`` names (each a
  market of its own).

Reported for each: requests served and refused (429 ``insufficient_quota``), the budget spent and
still unspent when the first refusal came, the priority revenue, and what the settlement rule cut
at the budget's edge (uncollected, ``accounts.selectors.collection``) as a share of it. Not a
test: the figures depend on the machine; the ratios between the two rules are the point.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import sys
import uuid
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path

from plotly.subplots import make_subplots

from accounts.rules import HOLD_HORIZON_FLOOR_S, HOLD_HORIZON_PRIOR_S, HOLD_MARGIN
from benchmarks.html import Section, Table, command_line, write_json, write_page

ENGINE_SETTINGS = ("max_running_requests=4", "step_fixed_s=0.03")  # the demo's engine
SYSTEM_PREFIX = tuple(range(1000, 1300))  # 300 shared prompt tokens
MAX_WAIT_S = 60.0
REFUSED = "insufficient_quota"  # a budget's refusal


@dataclass
class RuleRun:
    """One hold rule's bursts and what they came to. Dollars as exact decimal strings."""

    rule: str
    bursts: int = 0
    sent: int = 0
    served: int = 0
    refused: int = 0  # 429 insufficient_quota
    other_errors: int = 0
    unspent_at_first_refusal: str | None = None  # budget left when the first 429 came
    spent: str = "0"
    unspent: str = "0"  # the budget left when the bursts stopped
    priority_revenue: str = "0"
    uncollected: str = "0"
    uncollected_share: float = 0.0
    horizons_s: list[float] = field(default_factory=list)  # the hold horizon in each burst
    spent_after_burst: list[str] = field(default_factory=list)


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "benchmarks-holds")
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("set DATABASE_URL=postgres://... (the gateway's statements need PostgreSQL)")
    import django  # noqa: PLC0415

    django.setup()
    from django.core.management import call_command  # noqa: PLC0415

    call_command("migrate", verbosity=0)


def _prompts(rng: random.Random, n: int) -> list[tuple[int, ...]]:
    return [
        SYSTEM_PREFIX + tuple(rng.randrange(2000, 30000) for _ in range(rng.randrange(20, 200)))
        for _ in range(n)
    ]


def _bids(rng: random.Random, n: int, low: float, high: float) -> list[Decimal]:
    span = math.log(high) - math.log(low)
    return [Decimal(f"{math.exp(math.log(low) + rng.random() * span):.4f}") for _ in range(n)]


async def run_rule(
    *, rule: str, sized: dict[str, float] | None, engine_url: str, budget: Decimal, burst: int,
    max_bursts: int, seed: int, bids: tuple[float, float],
) -> RuleRun:  # fmt: skip
    """The bursts of one hold rule on a market and a tenant of its own: worst-case holds when
    ``sized`` is None, else sized ones renewed with ``sized`` (margin, floor_s)."""
    from asgiref.sync import sync_to_async  # noqa: PLC0415

    from accounts.models import Period  # noqa: PLC0415
    from accounts.selectors import budget_status  # noqa: PLC0415
    from accounts.selectors.collection import collection  # noqa: PLC0415
    from accounts.services import api_key_create, budget_set, tenant_ensure  # noqa: PLC0415
    from market.holds import hold_horizon_renew  # noqa: PLC0415
    from market.models import Market  # noqa: PLC0415
    from openai_api.gateway.admission import Trace  # noqa: PLC0415
    from openai_api.gateway.errors import GatewayError  # noqa: PLC0415
    from openai_api.gateway.selectors import caches_clear  # noqa: PLC0415
    from openai_api.gateway.services import completion_create  # noqa: PLC0415
    from openai_api.gateway.validation import CompletionParams  # noqa: PLC0415

    tag = uuid.uuid4().hex[:8]

    def setup() -> tuple[Market, object, str]:
        market = Market.objects.create(
            slug=f"holds-{tag}", name=f"holds {rule}", served_model=f"bench/holds-{tag}",
            engine_url=engine_url, max_wait_s=MAX_WAIT_S,
            hold_horizon_s=MAX_WAIT_S if sized is None else HOLD_HORIZON_PRIOR_S,
        )  # fmt: skip
        tenant = tenant_ensure(slug=f"holds-{tag}", name=f"holds {rule} {tag}")
        budget_set(tenant=tenant, limit=budget, period=Period.MONTH)
        _, key = api_key_create(tenant=tenant, name="bench", created_by=None)
        return market, tenant, key

    market, tenant, key = await sync_to_async(setup)()
    rng = random.Random(seed)
    out = RuleRun(rule=rule)
    for _ in range(max_bursts):
        caches_clear()  # the gateway reads the market's horizon now, not in 2 s
        out.horizons_s.append(market.hold_horizon_s)
        prompts, burst_bids = _prompts(rng, burst), _bids(rng, burst, *bids)

        async def one(prompt: tuple[int, ...], bid: Decimal) -> str:
            params = CompletionParams(
                endpoint="completions", model=market.served_model, max_tokens=8, stream=False,
                include_usage=False, request_class="interactive", bid=bid, prompt_ids=prompt,
            )  # fmt: skip
            try:
                await completion_create(params=params, key=key, trace=Trace("completions"))
            except GatewayError as exc:
                return "refused" if exc.code == REFUSED else f"error {exc.status} {exc.code}"
            return "served"

        results = await asyncio.gather(
            *(one(p, b) for p, b in zip(prompts, burst_bids, strict=True))
        )
        served, refused = results.count("served"), results.count("refused")
        out.bursts += 1
        out.sent += len(results)
        out.served += served
        out.refused += refused
        out.other_errors += len(results) - served - refused
        status = await sync_to_async(budget_status)(tenant=tenant)
        out.spent_after_burst.append(str(status.spent))
        if refused and out.unspent_at_first_refusal is None:
            out.unspent_at_first_refusal = str(status.limit - status.spent)
        if sized is not None:
            await sync_to_async(hold_horizon_renew)(market=market, **sized)
        print(
            f"  {rule}: burst {out.bursts}: {served} served, {refused} refused; spent "
            f"${status.spent:.4f} of ${status.limit:.2f}; horizon {out.horizons_s[-1]:.3g} s",
            flush=True,
        )
        if refused == len(results):
            break
    got = await sync_to_async(collection)(market_id=market.pk, tenant_id=tenant.pk)
    status = await sync_to_async(budget_status)(tenant=tenant)
    out.spent = str(status.spent)
    out.unspent = str(status.limit - status.spent)
    out.priority_revenue = str(got.priority)
    out.uncollected = str(got.uncollected)
    out.uncollected_share = got.uncollected_share
    return out


def table(runs: list[RuleRun], budget: Decimal) -> Table:
    columns = (
        "holds", "bursts", "served", "refused (429)", "unspent at first refusal", "spent",
        "unspent at the end", "priority revenue", "uncollected", "share of revenue",
    )  # fmt: skip
    rows = []
    for r in runs:
        unspent = "never refused" if r.unspent_at_first_refusal is None else (
            f"${Decimal(r.unspent_at_first_refusal):.2f} "
            f"({Decimal(r.unspent_at_first_refusal) / budget:.0%})"
        )  # fmt: skip
        rows.append(
            (
                r.rule, r.bursts, r.served, r.refused, unspent, f"${Decimal(r.spent):.4f}",
                f"${Decimal(r.unspent):.4f}", f"${Decimal(r.priority_revenue):.4f}",
                f"${Decimal(r.uncollected):.6f}", f"{r.uncollected_share:.3%}",
            )
        )  # fmt: skip
    return Table(columns, rows)


def write_html(runs: list[RuleRun], path: Path, budget: Decimal, command: str) -> None:
    fig = make_subplots(
        rows=1, cols=2,
        subplot_titles=("budget spent after each burst ($)", "requests served, refused"),
    )  # fmt: skip
    for r in runs:
        fig.add_scatter(
            x=list(range(1, r.bursts + 1)), y=[float(s) for s in r.spent_after_burst],
            mode="lines+markers", name=f"{r.rule}: spent", row=1, col=1,
        )  # fmt: skip
    names = [r.rule for r in runs]
    fig.add_bar(x=names, y=[r.served for r in runs], name="served", row=1, col=2)
    fig.add_bar(x=names, y=[r.refused for r in runs], name="refused", row=1, col=2)
    fig.update_xaxes(title_text="burst", row=1, col=1)
    fig.update_layout(barmode="group")
    section = Section("", tables=[table(runs, budget)], figures=[fig])
    write_page(path, "Holds at a budget's edge: worst case vs sized", [section], command=command)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=Decimal, default=Decimal("2"), help="dollars (2)")
    p.add_argument("--burst", type=int, default=40, help="requests per burst (40)")
    p.add_argument("--max-bursts", type=int, default=40)
    p.add_argument("--bids", default="0.02,0.5", help="low,high bid, $/s, log-uniform")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--sized",
        default=f"{HOLD_MARGIN:g}:{HOLD_HORIZON_FLOOR_S:g},2:{HOLD_HORIZON_FLOOR_S:g},1:0,1:1",
        help="sized-hold variants, MARGIN:FLOOR_S each (the rule's first)",
    )
    p.add_argument("--engine-speed", type=float, default=4.0, help="engine s per wall s (4)")
    p.add_argument("--json", type=Path)
    p.add_argument("--html", type=Path)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    _setup()
    from engines.sim.background import ServerThread  # noqa: PLC0415
    from engines.sim.server import ServerOptions  # noqa: PLC0415

    low, high = (float(v) for v in args.bids.split(","))
    options = ServerOptions.of(port=0, speed=args.engine_speed, settings=ENGINE_SETTINGS)
    sim = ServerThread(options).start()
    runs = []
    try:
        rules: list[tuple[str, dict[str, float] | None]] = [("worst case", None)]
        for variant in args.sized.split(","):
            margin, floor_s = (float(v) for v in variant.split(":"))
            name = f"sized x{margin:g}, floor {floor_s:g} s"
            rules.append((name, {"margin": margin, "floor_s": floor_s}))
        for rule, sized in rules:
            print(f"{rule}:", flush=True)
            runs.append(
                asyncio.run(
                    run_rule(
                        rule=rule, sized=sized, engine_url=sim.url, budget=args.budget,
                        burst=args.burst, max_bursts=args.max_bursts, seed=args.seed,
                        bids=(low, high),
                    )
                )
            )  # fmt: skip
    finally:
        sim.stop()
    print(table(runs, args.budget).markdown())
    if args.json:
        saved = vars(args) | {"json": str(args.json), "html": str(args.html),
                              "budget": str(args.budget)}  # fmt: skip
        write_json(args.json, {"args": saved, "runs": [asdict(r) for r in runs]})
    if args.html:
        write_html(runs, args.html, args.budget, command_line("benchmarks.holds", argv))


if __name__ == "__main__":
    main()
