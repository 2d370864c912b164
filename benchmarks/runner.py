"""Run workloads through the simulated engine in virtual time, one fresh engine per policy.

Every policy of a run sees the same arrivals (closed-loop turns excepted: an agent's next turn
arrives a think time after its previous turn finished, which depends on the policy).

Load is relative to the engine's measured capacity on the workload: the requests per second it
sustains in steady state when every request is queued at once (agents: every session starts at 0
and thinks for 0 s), served under fcfs in virtual time. Steady state leaves out the cold start
(the first batches compute the system prompts) and the drain at the end: capacity is the middle
half of the requests divided by the time between the first and the third quartile of their
finish times. ``--load 0.9`` means Poisson arrivals at 0.9 x that rate. Capacity depends on the
workload's content and on the engine config, not on the policy under test, and is measured once
per (workload, config) in a run (``Capacities``).

The engine admits new requests ahead of decoding while it has room (SGLang's prefill priority),
so TTFT stays near one prefill step until the running-request limit or the KV cache is full: a
closed-loop workload with fewer live sessions than ``max_running_requests`` never queues,
whatever the load.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from engines.contract.knobs import MarketKnobs
from engines.sim import Engine, EngineConfig, SimRequest
from engines.sim.driver import ArrivalQueue, run_virtual
from engines.sim.engine import StepResult
from mechanism import wait_bound as auto_bound

from .metrics import PolicyMetrics, Served, summarize
from .workloads import BenchRequest, Session, Workload

CAPACITY_POLICY = "fcfs"
# The automatic wait bound's renewal, virtual seconds: the market's periodic step's default
# (AUTO_RESERVE_INTERVAL_S).
WAIT_BOUND_RENEW_S = 10.0


@dataclass
class PolicyRun:
    """One policy's pass over a workload."""

    policy: str
    metrics: PolicyMetrics
    served: list[Served]
    makespan_s: float  # virtual seconds from the first arrival to the last finish
    wall_s: float  # real seconds the simulation took
    steps: int
    rounds: int
    wait_bounds_s: list[float] = field(default_factory=list)  # automatic: each bound in force


@dataclass
class Point:
    """All policies on one workload at one load (``load`` is None for traces)."""

    workload: Workload
    load: float | None
    capacity_rps: float | None
    rate_rps: float | None
    runs: dict[str, PolicyRun] = field(default_factory=dict)


def sim_request(req: BenchRequest) -> SimRequest:
    """``req`` as the simulated engine takes it."""
    return SimRequest(req.id, req.tokens, req.max_new_tokens, req.bid, req.arrival)


def simulate(
    workload: Workload,
    policy: str,
    config: EngineConfig,
    *,
    knobs: MarketKnobs | None = None,
    on_served: Callable[[], None] | None = None,
    wait_multiple: float | None = None,
) -> PolicyRun:
    """Serve every request of ``workload`` under ``policy`` on a fresh engine (no order books:
    the benchmark reads no round record's subtrees). ``wait_multiple``: the wait bound is the
    market's automatic one (``mechanism.wait_bound``, at this multiple of the mean wait; None:
    the bound the knobs set), renewed every ``WAIT_BOUND_RENEW_S`` virtual seconds from the
    times to first token served so far, as the market renews it."""
    knobs = replace(knobs or MarketKnobs(), book_interval_s=None)
    if wait_multiple is not None:
        knobs = knobs.with_wait_bound(auto_bound.PRIOR_S)
    engine = Engine(config, policy, knobs=knobs)
    recent: deque[float] = deque(maxlen=auto_bound.WINDOW)  # newest first
    bounds = [knobs.wait_bound_s] if wait_multiple is not None else []
    first = list(workload.requests)
    turns: dict[str, tuple[Session, int]] = {}
    classes = {r.id: r.bid_class for r in workload.requests}
    for s in workload.sessions:
        req = s.first_turn()
        first.append(req)
        turns[req.id] = (s, 0)
        classes[req.id] = s.bid_class
    queue = ArrivalQueue([sim_request(r) for r in first])
    served: list[Served] = []

    def finished(req: SimRequest) -> None:
        served.append(
            Served(req.id, req.bid, classes[req.id], req.arrival, req.ttft, req.e2e, req.charge)
        )
        recent.appendleft(req.ttft)
        turn = turns.pop(req.id, None)
        if turn is not None:
            session, k = turn
            nxt = session.next_turn(k, req.tokens, req.output, req.finished_at)
            if nxt is not None:
                turns[nxt.id] = (session, k + 1)
                classes[nxt.id] = session.bid_class
                queue.push(sim_request(nxt))
        if on_served is not None:
            on_served()

    start = min((r.arrival for r in first), default=0.0)
    renew_at = start + WAIT_BOUND_RENEW_S

    def renewed(step: StepResult) -> None:
        nonlocal renew_at
        if step.end < renew_at:
            return
        renew_at = step.end + WAIT_BOUND_RENEW_S
        assert wait_multiple is not None
        bound = auto_bound.wait_bound_renewed(
            engine.knobs.wait_bound_s, recent, multiple=wait_multiple
        )
        if bound != engine.knobs.wait_bound_s:
            engine.set_wait_bound(bound)
            bounds.append(bound)

    t0 = time.perf_counter()
    end = run_virtual(
        engine,
        queue,
        on_finished=finished,
        on_step=renewed if wait_multiple is not None else None,
        start=start,
    )
    wall = time.perf_counter() - t0
    if len(served) != workload.requests_total:
        raise RuntimeError(
            f"{policy}: the engine stopped with {len(served)} of {workload.requests_total} "
            f"requests served"
        )
    makespan = end - start
    metrics = summarize(
        served,
        makespan_s=makespan,
        tokens=engine.prompt_tokens + engine.generated_tokens,
        cache_hit_rate=engine.cache_hit_rate,
        recomputed_prefix_tokens=engine.recomputed_prompt_tokens,
    )
    return PolicyRun(policy, metrics, served, makespan, wall, engine.steps, engine.rounds, bounds)


def steady_throughput(finish_times: list[float], makespan_s: float) -> float:
    """Requests per second between the first and third quartiles of the finish times (the whole
    run when that span is empty, as for a handful of requests)."""
    times = sorted(finish_times)
    n = len(times)
    lo, hi = n // 4, (3 * n) // 4
    if hi > lo and times[hi - 1] > times[lo]:
        return (hi - lo) / (times[hi - 1] - times[lo])
    return n / makespan_s


class Capacities:
    """Measured capacity (requests per second) per (workload, engine config), cached."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, EngineConfig, MarketKnobs], float] = {}

    def get(
        self, workload: Workload, config: EngineConfig, knobs: MarketKnobs | None = None
    ) -> float:
        """The capacity under ``knobs`` without a reserve (a reserve does not change the work)."""
        knobs = replace(knobs or MarketKnobs(), reserve=0.0)
        key = (workload.key, config, knobs)
        if key not in self._cache:
            run = simulate(workload.all_at_once(), CAPACITY_POLICY, config, knobs=knobs)
            self._cache[key] = steady_throughput(
                [r.arrival + r.e2e_s for r in run.served], run.makespan_s
            )
        return self._cache[key]


def run_point(
    workload: Workload,
    policies: list[str],
    config: EngineConfig,
    *,
    knobs: MarketKnobs | None = None,
    load: float | None = None,
    seed: int = 0,
    capacities: Capacities | None = None,
    on_served: Callable[[], None] | None = None,
    on_policy: Callable[[str], None] | None = None,
    wait_multiple: float | None = None,
) -> Point:
    """Run ``policies`` on ``workload``: at ``load`` x capacity, or as given (a trace);
    ``wait_multiple``: under the market's automatic wait bound at that multiple
    (``simulate``)."""
    capacity = rate = None
    if load is not None:
        if not load > 0:
            raise ValueError(f"load must be > 0, got {load}")
        capacity = (capacities or Capacities()).get(workload, config, knobs)
        rate = load * capacity
        workload = workload.at_rate(rate, seed)
    point = Point(workload, load, capacity, rate)
    for policy in policies:
        if on_policy is not None:
            on_policy(policy)
        point.runs[policy] = simulate(
            workload,
            policy,
            config,
            knobs=knobs,
            on_served=on_served,
            wait_multiple=wait_multiple,
        )
    return point
