"""The waiting queue a round record carries for the console's reserve what-if: cleared again at
the round's own reserve, it charges the requests the round admitted exactly what the record
says they paid; and a malformed queue is refused, naming its field."""

from __future__ import annotations

import copy
import random

import pytest

from engines.contract.knobs import MarketKnobs
from engines.contract.records import round_record_checked, round_record_dumps, round_record_loads
from engines.sim import Engine, EngineConfig, SimRequest
from engines.sim.driver import ArrivalQueue, run_virtual
from mechanism.whatif import queue_reclear

# A slow prefill (small steps) so that a queue forms and each round admits a few of it.
SLOW = EngineConfig(
    prefill_token_s=1e-3, max_prefill_tokens=256, chunked_prefill_size=256, max_running_requests=16
)
PROMPTS = [tuple(range(s, s + n)) for s, n in ((1000, 120), (2000, 40), (3000, 200), (4000, 8))]


def workload(seed: int, n: int = 120) -> list[SimRequest]:
    """Requests on four shared system prompts (some sharing a second level too), bids spread
    over three orders of magnitude, some at 0, arriving over 1 s, two tenants."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        prompt = rnd.choice(PROMPTS)
        middle = (7, 7, 7) if rnd.random() < 0.3 else ()
        tokens = prompt + middle + tuple(rnd.randrange(10**6) for _ in range(rnd.randint(20, 120)))
        bid = 0.0 if rnd.random() < 0.15 else round(10 ** rnd.uniform(-4, -1), 6)
        arrival = round(rnd.uniform(0, 1), 3)
        out.append(SimRequest(f"r{i}", tokens, rnd.randint(1, 8), bid, arrival, f"t{i % 2}"))
    return out


def rounds(policy: str, knobs: MarketKnobs, seed: int, queue_interval_s: float = 0.0) -> list[dict]:
    """The engine's records over the workload, the queue in every record with the book."""
    engine = Engine(SLOW, policy, knobs=knobs)
    engine.recorder.queue_interval_s = queue_interval_s
    records: list[dict] = []
    run_virtual(
        engine,
        ArrivalQueue(workload(seed)),
        on_step=lambda s: s.record and records.append(s.record),
    )
    # As the console gets them: through JSON and the check.
    return [round_record_loads(round_record_dumps(r)) for r in records]


@pytest.mark.parametrize(
    ("policy", "reserve", "scope", "wait_bound_s"),
    [
        ("dfs-auction-density", 0.003, "request", 0.0),
        ("dfs-auction", 0.001, "request", 0.0),
        ("dfs-auction-kv-split", 0.0, "tenant", 0.0),
        ("dfs-auction-density", 0.002, "request", 0.5),  # age credits in the queue
        ("highest-bid", 0.01, "request", 0.0),
        ("fcfs", 0.002, "request", 0.0),
    ],
)
def test_the_recorded_queue_cleared_again_at_its_reserve_charges_what_the_round_recorded(
    policy, reserve, scope, wait_bound_s
):
    knobs = MarketKnobs(
        reserve=reserve, book_interval_s=0.0, charge_scope=scope, wait_bound_s=wait_bound_s
    )
    records = rounds(policy, knobs, seed=7)
    with_queue = [r for r in records if "queue" in r]
    assert len(with_queue) == len(records) > 10  # a book interval of 0: every round has one
    assert sum(len(r["admitted"]) < r["waiting"] for r in with_queue) > 5  # a queue formed
    paid = 0
    for record in with_queue:
        (outcome,) = queue_reclear(
            record["queue"],
            policy=record["policy"],
            tokens_per_second=record["tokens_per_second"],
            admitted=[a["position"] for a in record["admitted"]],
            reserves=[record["reserve"]],
        )
        # Request by request, the same ids at the admitted places and the same charges, exactly.
        assert outcome.charged == tuple((a["request_id"], a["charge"]) for a in record["admitted"])
        assert outcome.revenue == sum(a["charge"] for a in record["admitted"])
        assert outcome.waiting == record["waiting"]
        paid += sum(a["charge"] > 0 for a in record["admitted"])
    if policy != "fcfs":
        assert paid > 10  # priority was charged: the comparison compared something
    if wait_bound_s:
        assert any("credit" in r["queue"] for r in with_queue)


def test_the_queue_comes_with_the_book_and_less_often():
    knobs = MarketKnobs(book_interval_s=0.5)
    records = rounds("dfs-auction-density", knobs, seed=3, queue_interval_s=2.0)
    with_book = [r for r in records if "waiting_bids" in r]
    with_queue = [r for r in records if "queue" in r]
    assert 1 < len(with_queue) < len(with_book) < len(records)
    assert all("waiting_bids" in r for r in with_queue)
    times = [r["time"] for r in with_queue]
    assert all(b - a >= 2.0 for a, b in zip(times, times[1:], strict=False))


@pytest.fixture(scope="module")
def record() -> dict:
    knobs = MarketKnobs(book_interval_s=0.0)
    return next(r for r in rounds("dfs-auction-density", knobs, seed=5) if r["waiting"] > 3)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("parent", [5]),  # not an earlier node
        ("edge", "3"),
        ("edge", [0]),
        ("node", [10**6]),
        ("id", None),
        ("bid", [float("nan")]),
        ("bid", [-1.0]),
        ("arrival", ["soon"]),
        ("cached", [-1]),
        ("cached", [10**6]),  # longer than the prompt
        ("overhead_tokens", -1),
        ("charge_scope", "everyone"),
        ("owner", [1]),
        ("credit", [-1]),
    ],
)
def test_a_malformed_queue_is_refused_naming_its_field(record, field, bad):
    broken = copy.deepcopy(record)
    queue = broken["queue"]
    if isinstance(bad, list) and field in queue and isinstance(queue[field], list):
        bad = bad + queue[field][len(bad) :]  # the first entry bad, the rest as recorded
    queue[field] = bad
    with pytest.raises(ValueError, match=rf"queue.*'{field}'"):
        round_record_checked(broken)


def test_a_queue_of_another_length_than_the_round_is_refused(record):
    broken = copy.deepcopy(record)
    broken["waiting"] += 1
    with pytest.raises(ValueError, match="queue.*'waiting'"):
        round_record_checked(broken)
    broken = copy.deepcopy(record)
    broken["queue"]["id"][1] = broken["queue"]["id"][0]
    with pytest.raises(ValueError, match="queue.*'id'"):
        round_record_checked(broken)
    broken = copy.deepcopy(record)
    broken["queue"]["bid"].pop()
    with pytest.raises(ValueError, match="queue.*'bid'"):
        round_record_checked(broken)
