"""The benchmark's workloads, seeded and deterministic: the same seed gives the same requests.

A workload is a list of open-loop requests (each with its own arrival time) and, for agents, a
list of closed-loop sessions whose next turn is only known once the previous one has finished
(its prompt contains the engine's actual output). Generated workloads are built with every
arrival at 0; ``Workload.at_rate`` spreads them as a Poisson process, ``Workload.all_at_once``
queues them all at time 0 (the capacity measurement, runner.py).

Prompts are random token ids in [0, VOCAB), which never collide by accident beyond the first
token or two, so the only sharing is the sharing the workload puts there.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, replace

from .bids import BidSpec

VOCAB = 32_000


@dataclass(frozen=True)
class BenchRequest:
    """One request of a run. ``arrival`` is seconds; ``bid`` dollars per second of waiting."""

    id: str
    tokens: tuple[int, ...]
    max_new_tokens: int
    bid: float
    bid_class: str
    arrival: float = 0.0
    tenant: str = "-"


@dataclass(frozen=True)
class Session:
    """A closed-loop agent: turn k's prompt is turn k-1's prompt + its output + ``messages[k]``.

    Turn 0 arrives at ``start``; turn k >= 1 arrives ``think_s[k - 1]`` seconds after turn k-1
    finishes. Every turn bids the same (the session's urgency).
    """

    id: str
    prefix: tuple[int, ...]  # the shared tool/system prompt
    messages: tuple[tuple[int, ...], ...]  # one user message per turn
    think_s: tuple[float, ...]  # one per turn after the first, seconds
    max_new_tokens: int
    bid: float
    bid_class: str
    start: float = 0.0

    def turn(self, k: int, context: tuple[int, ...], arrival: float) -> BenchRequest:
        """Turn k: ``context`` (the conversation so far) + ``messages[k]``, at ``arrival``."""
        return BenchRequest(
            f"{self.id}-t{k:02d}",
            context + self.messages[k],
            self.max_new_tokens,
            self.bid,
            self.bid_class,
            arrival,
            self.id,
        )

    def first_turn(self) -> BenchRequest:
        """Turn 0: the prefix and the first message."""
        return self.turn(0, self.prefix, self.start)

    def next_turn(
        self, k: int, prompt: tuple[int, ...], output: tuple[int, ...], finished_at: float
    ) -> BenchRequest | None:
        """Turn k+1 after turn k (``prompt``, ``output``) finished at ``finished_at``; None at
        the last turn."""
        if k + 1 >= len(self.messages):
            return None
        return self.turn(k + 1, prompt + output, finished_at + self.think_s[k])


@dataclass(frozen=True)
class Workload:
    """Requests to serve: open-loop ``requests`` plus closed-loop ``sessions``.

    ``key`` names the workload's content (not its arrival times): the capacity measured on it is
    cached under this key. ``requests_total`` counts every request, later turns included.
    """

    name: str
    key: str
    requests: tuple[BenchRequest, ...] = ()
    sessions: tuple[Session, ...] = ()
    title: str = ""  # one line for the report

    @property
    def requests_total(self) -> int:
        return len(self.requests) + sum(len(s.messages) for s in self.sessions)

    def at_rate(self, rate_rps: float, seed: int) -> Workload:
        """Poisson arrivals at ``rate_rps`` requests per second (sessions start at rate / turns).

        The gaps are unit exponentials drawn from ``seed`` divided by the rate, so every load
        level of a sweep sees the same pattern of arrivals, only faster or slower.
        """
        if not rate_rps > 0:
            raise ValueError(f"arrival rate must be > 0, got {rate_rps}")
        rng = random.Random(f"{seed}:arrivals:{self.key}")
        t = 0.0
        requests = []
        for req in self.requests:
            t += rng.expovariate(1.0) / rate_rps
            requests.append(replace(req, arrival=t))
        t = 0.0
        sessions = []
        for s in self.sessions:
            t += rng.expovariate(1.0) * len(s.messages) / rate_rps
            sessions.append(replace(s, start=t))
        return replace(self, requests=tuple(requests), sessions=tuple(sessions))

    def all_at_once(self) -> Workload:
        """Every request (every session's first turn) at time 0 and no think time."""
        return replace(
            self,
            requests=tuple(replace(r, arrival=0.0) for r in self.requests),
            sessions=tuple(
                replace(s, start=0.0, think_s=(0.0,) * len(s.think_s)) for s in self.sessions
            ),
        )


def random_tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    """``n`` random token ids."""
    return tuple(rng.choices(range(VOCAB), k=n))


def _positive(**values: float) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def gsp(
    *,
    num_groups: int = 64,
    prompts_per_group: int = 16,
    system_prompt_len: int = 2048,
    question_len: int = 128,
    output_len: int = 256,
    popularity: str = "uniform",
    zipf_s: float = 1.0,
    bids: BidSpec | None = None,
    seed: int = 0,
) -> Workload:
    """SGLang bench_serving's generated-shared-prefix workload, in token ids.

    ``num_groups`` system prompts of ``system_prompt_len`` tokens; each request is one of them
    plus its own question of ``question_len`` tokens and asks for ``output_len`` tokens.
    ``uniform``: every group gets ``prompts_per_group`` requests (as SGLang). ``zipf``: the same
    total, each request's group drawn with weight 1 / rank^zipf_s. Requests are shuffled.
    """
    _positive(
        num_groups=num_groups,
        prompts_per_group=prompts_per_group,
        system_prompt_len=system_prompt_len,
        question_len=question_len,
        output_len=output_len,
    )
    if popularity not in ("uniform", "zipf"):
        raise ValueError(f"popularity must be uniform or zipf, got {popularity!r}")
    if popularity == "zipf" and not zipf_s > 0:
        raise ValueError(f"zipf exponent must be > 0, got {zipf_s}")
    rng = random.Random(f"{seed}:gsp")
    systems = [random_tokens(rng, system_prompt_len) for _ in range(num_groups)]
    total = num_groups * prompts_per_group
    if popularity == "uniform":
        groups = [g for g in range(num_groups) for _ in range(prompts_per_group)]
    else:
        weights = [1.0 / (rank + 1) ** zipf_s for rank in range(num_groups)]
        groups = rng.choices(range(num_groups), weights=weights, k=total)
    rng.shuffle(groups)
    bids = bids or BidSpec()
    bid_rng = random.Random(f"{seed}:bids")
    requests = []
    for i, g in enumerate(groups):
        bid, cls = bids.draw(bid_rng)
        tokens = systems[g] + random_tokens(rng, question_len)
        requests.append(BenchRequest(f"g{g:04d}-r{i:05d}", tokens, output_len, bid, cls))
    key = (
        f"gsp:{seed}:{num_groups}x{prompts_per_group}:{system_prompt_len}+{question_len}"
        f"->{output_len}:{popularity}:{zipf_s}:{bids}"
    )
    title = (
        f"gsp: {total} requests, {num_groups} groups x {prompts_per_group} ({popularity}"
        + (f" s={zipf_s:g}" if popularity == "zipf" else "")
        + f"), system {system_prompt_len} + question {question_len} -> {output_len} tokens"
    )
    return Workload("gsp", key, tuple(requests), title=title)


def nosharing(
    *,
    num_requests: int = 1024,
    prompt_len: int = 2176,
    output_len: int = 256,
    bids: BidSpec | None = None,
    seed: int = 0,
) -> Workload:
    """Independent random prompts: nothing to share, the cache cannot help."""
    _positive(num_requests=num_requests, prompt_len=prompt_len, output_len=output_len)
    rng = random.Random(f"{seed}:nosharing")
    bids = bids or BidSpec()
    bid_rng = random.Random(f"{seed}:bids")
    requests = []
    for i in range(num_requests):
        bid, cls = bids.draw(bid_rng)
        requests.append(
            BenchRequest(f"n{i:05d}", random_tokens(rng, prompt_len), output_len, bid, cls)
        )
    key = f"nosharing:{seed}:{num_requests}:{prompt_len}->{output_len}:{bids}"
    title = f"nosharing: {num_requests} requests, prompt {prompt_len} -> {output_len} tokens"
    return Workload("nosharing", key, tuple(requests), title=title)


def agents(
    *,
    sessions: int = 64,
    turns: int = 8,
    prefix_len: int = 2048,
    message_len: int = 128,
    output_len: int = 256,
    think_s: float = 2.0,
    bids: BidSpec | None = None,
    seed: int = 0,
) -> Workload:
    """Multi-turn agent sessions over one shared tool/system prefix of ``prefix_len`` tokens.

    Each turn adds a user message of ``message_len`` tokens to the conversation so far and asks
    for ``output_len`` tokens; think times are exponential with mean ``think_s`` seconds.
    """
    _positive(
        sessions=sessions,
        turns=turns,
        prefix_len=prefix_len,
        message_len=message_len,
        output_len=output_len,
    )
    if not think_s >= 0:
        raise ValueError(f"think time must be >= 0, got {think_s}")
    rng = random.Random(f"{seed}:agents")
    bids = bids or BidSpec()
    bid_rng = random.Random(f"{seed}:bids")
    prefix = random_tokens(rng, prefix_len)
    out = []
    for i in range(sessions):
        bid, cls = bids.draw(bid_rng)
        messages = tuple(random_tokens(rng, message_len) for _ in range(turns))
        thinks = tuple(rng.expovariate(1.0 / think_s) if think_s > 0 else 0.0 for _ in messages)
        out.append(Session(f"a{i:04d}", prefix, messages, thinks[1:], output_len, bid, cls))
    key = (
        f"agents:{seed}:{sessions}x{turns}:{prefix_len}+{message_len}->{output_len}:"
        f"{think_s}:{bids}"
    )
    title = (
        f"agents: {sessions} sessions x {turns} turns, prefix {prefix_len} + {message_len} per "
        f"message -> {output_len} tokens, think {think_s:g} s"
    )
    return Workload("agents", key, sessions=tuple(out), title=title)


# chat: the lognormal quantile at 0.99 in standard deviations (p99 / median = exp(Z99 x sigma)).
_Z99 = 2.3263478740408408


def chat(
    *,
    num_requests: int = 1024,
    conversations: int = 256,
    system_prompt_len: int = 64,
    median_len: int = 256,
    sigma: float = 1.25,
    output_len: int = 128,
    bids: BidSpec | None = None,
    seed: int = 0,
) -> Workload:
    """Production-like chat: heavy-tailed prompt lengths over one shared system prompt.

    Every prompt starts with the same ``system_prompt_len`` tokens (the root of the request
    tree), then its conversation's history: ``conversations`` branches from that root. Each
    request belongs to a conversation drawn uniformly; a conversation's later turns extend its
    earlier ones (turn k's prompt is a prefix of turn k+1's), and come later in the list.

    Prompt lengths (tokens, system prompt included) are the system prompt plus a lognormal
    conversation part whose median makes the whole prompt's median ``median_len``; with the
    default ``sigma`` the p99 is about 14x the median (production traces: median ~7k tokens,
    p99 ~85k; here at about 1/32 of that). The lengths drawn for a conversation are sorted
    before being given to its turns in order, so the lengths of all requests are still the
    independent draws.
    """
    _positive(
        num_requests=num_requests,
        conversations=conversations,
        system_prompt_len=system_prompt_len,
        output_len=output_len,
    )
    if not median_len > system_prompt_len:
        raise ValueError(
            f"median_len ({median_len} tokens) must exceed system_prompt_len "
            f"({system_prompt_len} tokens)"
        )
    if not 0 < sigma < 4:
        raise ValueError(f"sigma must be in (0, 4), got {sigma}")
    if conversations > VOCAB:
        raise ValueError(f"at most {VOCAB} conversations, got {conversations}")
    rng = random.Random(f"{seed}:chat")
    system = random_tokens(rng, system_prompt_len)
    owners = rng.choices(range(conversations), k=num_requests)
    mu = math.log(median_len - system_prompt_len)
    lengths: dict[int, list[int]] = {}
    for c in owners:
        lengths.setdefault(c, []).append(max(1, round(rng.lognormvariate(mu, sigma))))
    # The first token of each history differs from every other's: one branch each.
    firsts = rng.sample(range(VOCAB), conversations)
    histories: dict[int, tuple[int, ...]] = {}
    for c, ls in lengths.items():
        ls.sort(reverse=True)  # popped from the end: shortest turn first
        histories[c] = (firsts[c], *random_tokens(rng, ls[0] - 1))
    bids = bids or BidSpec()
    bid_rng = random.Random(f"{seed}:bids")
    requests = []
    turns: Counter[int] = Counter()
    for i, c in enumerate(owners):
        bid, cls = bids.draw(bid_rng)
        n = lengths[c].pop()
        rid = f"c{c:04d}-t{turns[c]:03d}-r{i:05d}"
        turns[c] += 1
        requests.append(BenchRequest(rid, system + histories[c][:n], output_len, bid, cls))
    key = (
        f"chat:{seed}:{num_requests}/{conversations}:{system_prompt_len}+"
        f"ln({median_len},{sigma})->{output_len}:{bids}"
    )
    title = (
        f"chat: {num_requests} requests in {conversations} conversations under one "
        f"{system_prompt_len}-token system prompt, prompt lengths lognormal (median "
        f"{median_len}, p99 ~{median_len_p99(median_len, system_prompt_len, sigma)} tokens) "
        f"-> {output_len} tokens"
    )
    return Workload("chat", key, tuple(requests), title=title)


def median_len_p99(median_len: int, system_prompt_len: int, sigma: float) -> int:
    """The p99 prompt length (tokens) of ``chat`` with these parameters, from the lognormal."""
    return round(system_prompt_len + (median_len - system_prompt_len) * math.exp(_Z99 * sigma))
