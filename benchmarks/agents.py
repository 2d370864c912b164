"""A load of agents bidding through the gateway: what keeps the live demo market busy.

    python -m benchmarks.agents --base-url http://127.0.0.1:8000/v1 \\
        --key acme=im_... --key globex=im_... --model sim-8b --load 0.85

(``AGENT_KEYS="acme=im_... globex=im_..."`` in the environment instead of ``--key``: keys on
a command line are visible to anyone on the host through ``ps``.)

Each tenant runs multi-turn sessions with the official ``openai`` client: a session opens on
the tenant's tool prompt (shared by all its sessions, so their prefixes share the KV cache),
then asks questions turn by turn, each turn's prompt holding the conversation so far. Some
sessions are ``interactive`` and bid explicitly (``extra_body={"bid": ...}``, dollars per
second of waiting); the others are ``background`` and send no bid, so the tenant's autobidder
(if it has one) bids for them. A tenant named by ``--autobid`` sends no bid for its interactive
requests either: its autobidder bids for them too. Arrivals are Poisson; the generator prints a
line per minute.
Errors (429 ``insufficient_quota`` when a budget is spent, 429 ``queue_full``, 503) are counted,
not fatal: the agent waits and goes on, as a program with a retry policy would.

How much load: ``--load L`` sizes it to what the engines behind the gateway serve, measured at
start (:func:`capacity_measure`): a burst of first turns sent at once, its steady throughput in
requests per second taken as the benchmarks take capacity (``benchmarks.runner``: the middle
half of the requests over the time between the first and third quartile of their finish times);
sessions then start at L x that rate divided by a session's mean turns, so the engines are busy
(a queue forms, bids order it) without a queue that only grows. ``--sessions-per-minute N``
sets the rate instead.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence

import openai

from benchmarks.runner import steady_throughput

KEYS_ENV = "AGENT_KEYS"  # "acme=im_... globex=im_...": the keys kept out of the command line
TOOLS = (
    "search(query) finds documents; fetch(url) reads one; calc(expression) evaluates "
    "arithmetic; sql(query) runs a read-only query on the warehouse; chart(spec) draws"
)
TOPICS = (
    "quarterly revenue by region",
    "churn of enterprise accounts",
    "latency of the EU cluster",
    "the onboarding funnel",
    "GPU spend per team",
    "support tickets about billing",
    "inventory turnover",
    "the A/B test on pricing",
    "hiring pipeline",
    "cache hit rates",
)
MAX_TOKENS = (32, 64, 128)  # a turn's answer, tokens (uniform)
TURNS = (2, 6)  # a session's turns, uniform: 4 on average
PROBE_CLASS = "capacity-probe"  # the request_class of the burst that measures the capacity
WORDS = tuple(
    "please summarize compare explain list why how trend last month week top five drivers risks "
    "next steps table chart".split()
)


def tool_prompt(tenant: str, length_words: int = 400) -> str:
    """A tenant's system prompt: its tools and house rules, the same for all its sessions."""
    rng = random.Random(f"tools:{tenant}")
    rules = " ".join(rng.choice(WORDS) for _ in range(length_words))
    return f"You are {tenant}'s analyst agent. Tools: {TOOLS}. House rules: {rules}."


class Tenant:
    """One tenant's agents: a client with its API key and its traffic mix."""

    def __init__(
        self, name: str, key: str, base_url: str, model: str, rng: random.Random,
        autobid: bool = False,
    ) -> None:  # fmt: skip
        self.name = name
        self.autobid = autobid  # its interactive requests send no bid either: its autobidder's
        self.model = model
        self.rng = rng
        self.client = openai.AsyncOpenAI(api_key=key, base_url=base_url, max_retries=0)
        self.system = tool_prompt(name)
        self.counts: Counter[str] = Counter()

    def question(self) -> str:
        """A user's question about one of the topics."""
        return f"{self.rng.choice(WORDS)} {self.rng.choice(TOPICS)}: " + " ".join(
            self.rng.choice(WORDS) for _ in range(self.rng.randint(8, 30))
        )

    async def probe(self) -> float | None:
        """One first turn of a session (bid 0: flex), as the capacity probe sends it; the
        monotonic time it finished, None when it failed."""
        try:
            await self.client.chat.completions.create(
                model=self.model,
                messages=[
                    {"role": "system", "content": self.system},
                    {"role": "user", "content": self.question()},
                ],
                max_tokens=self.rng.choice(MAX_TOKENS),
                extra_body={"request_class": PROBE_CLASS, "bid": "0"},
            )
        except (openai.APIStatusError, openai.APIConnectionError) as exc:
            self.counts[f"probe {type(exc).__name__}"] += 1
            return None
        return time.monotonic()

    async def session(self, turns: int, interactive: bool) -> None:
        """One conversation of ``turns`` turns."""
        messages = [{"role": "system", "content": self.system}]
        request_class = "interactive" if interactive else "background"
        for _ in range(turns):
            messages.append({"role": "user", "content": self.question()})
            extra: dict[str, object] = {"request_class": request_class}
            if interactive and not self.autobid:
                # Interactive users value their time: lognormal around 5 cents per second.
                extra["bid"] = f"{self.rng.lognormvariate(-3.0, 0.8):.6f}"
            try:
                reply = await self.client.chat.completions.create(
                    model=self.model,
                    messages=messages,
                    max_tokens=self.rng.choice(MAX_TOKENS),
                    extra_body=extra,
                )
            except openai.APIStatusError as exc:
                spent = exc.code == "insufficient_quota"  # a budget, not a full queue
                self.counts["budget spent" if spent else f"http {exc.status_code}"] += 1
                await asyncio.sleep(5.0 if spent else 1.0)
                return
            except openai.APIConnectionError:
                self.counts["connection error"] += 1
                await asyncio.sleep(2.0)
                return
            self.counts[request_class] += 1
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            await asyncio.sleep(self.rng.expovariate(1 / 2.0))  # think time, seconds


async def gateway_wait(client: openai.AsyncOpenAI, timeout_s: float = 120.0) -> None:
    """Until the gateway answers (``GET /v1/models``): the agents may start before it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await client.models.list()
            return
        except openai.APIConnectionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


async def capacity_measure(tenants: Sequence[Tenant], requests: int) -> float:
    """The requests per second the engines behind the gateway serve, measured: ``requests``
    first turns sent at once (round-robin over the tenants), the steady throughput of those
    that succeeded (``benchmarks.runner.steady_throughput``)."""
    await gateway_wait(tenants[0].client)
    started = time.monotonic()
    finished = await asyncio.gather(*(tenants[i % len(tenants)].probe() for i in range(requests)))
    times = [t - started for t in finished if t is not None]
    if len(times) < requests // 2:
        raise RuntimeError(
            f"capacity probe: {requests - len(times)} of {requests} requests failed; "
            f"{'; '.join(f'{t.name}: {dict(t.counts)}' for t in tenants)}"
        )
    return steady_throughput(times, time.monotonic() - started)


def sessions_per_minute(load: float, capacity_rps: float) -> float:
    """The session arrival rate (per minute) that offers ``load`` x ``capacity_rps`` requests
    per second: each session sends its turns one after the other, :data:`TURNS` on average."""
    return load * capacity_rps * 60.0 / (sum(TURNS) / 2)


async def run(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    tenants = []
    for item in args.key:
        name, _, key = item.partition("=")
        if not key:
            raise SystemExit(f"--key needs TENANT=KEY, got {item!r}")
        tenants.append(
            Tenant(
                name, key, args.base_url, args.model, random.Random(rng.random()),
                autobid=name in args.autobid,
            )
        )  # fmt: skip
    per_minute = args.sessions_per_minute
    if per_minute is None:
        capacity = await capacity_measure(tenants, args.probe_requests)
        per_minute = sessions_per_minute(args.load, capacity)
        print(
            f"agents: capacity {capacity:.2f} requests/s measured ({args.probe_requests} first "
            f"turns at once); load {args.load:g} x capacity = {per_minute:.1f} sessions/min",
            flush=True,
        )
    rate = per_minute / 60.0
    live: set[asyncio.Task] = set()
    started = time.monotonic()
    next_report = started + 60.0
    deadline = started + args.duration if args.duration else None
    while deadline is None or time.monotonic() < deadline:
        await asyncio.sleep(rng.expovariate(rate))
        if len(live) < args.max_sessions:
            tenant = rng.choice(tenants)
            task = asyncio.create_task(
                tenant.session(rng.randint(*TURNS), rng.random() < args.interactive_share)
            )
            live.add(task)
            task.add_done_callback(live.discard)
        if time.monotonic() >= next_report:
            next_report += 60.0
            summary = "; ".join(f"{t.name}: {dict(t.counts)}" for t in tenants)
            print(f"agents: {len(live)} sessions live; {summary}", flush=True)
    for task in live:
        task.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument(
        "--key", action="append", default=[],
        help=f"TENANT=API_KEY (repeat); or ${KEYS_ENV}, space-separated (not seen in ps)",
    )  # fmt: skip
    parser.add_argument("--model", required=True, help="the market's served model")
    parser.add_argument(
        "--load", type=float, default=0.85,
        help="offered load, x the engines' capacity measured at start (0.85)",
    )  # fmt: skip
    parser.add_argument(
        "--sessions-per-minute", type=float, default=None,
        help="sessions started per minute, instead of --load (no capacity probe)",
    )  # fmt: skip
    parser.add_argument(
        "--probe-requests", type=int, default=48,
        help="first turns sent at once to measure the capacity (48)",
    )  # fmt: skip
    parser.add_argument(
        "--autobid", action="append", default=[], metavar="TENANT",
        help="(repeat) this tenant's interactive requests send no bid either: its autobidder "
        "bids for them",
    )  # fmt: skip
    parser.add_argument("--max-sessions", type=int, default=64)
    parser.add_argument("--interactive-share", type=float, default=0.3)
    parser.add_argument("--duration", type=float, default=0.0, help="seconds; 0 runs forever")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.key += os.environ.get(KEYS_ENV, "").split()
    if not args.key:
        parser.error(f"give at least one --key TENANT=API_KEY (or ${KEYS_ENV})")
    try:
        asyncio.run(run(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
