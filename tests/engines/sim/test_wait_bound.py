"""The wait bound on the simulated engine (MarketKnobs.wait_bound_s, mechanism.aging.WaitBound):
an old, long, low-bid request is served ahead of newer requests of higher bid density once it
has waited the bound, not before, and its charge is the reference's with its credit kept.

The case, worked by hand. One request runs at a time and each answers one token, so every step
is one round that admits the head of the order. The plan: 100 tokens/s, no per-request
overhead, no prompt shared. Bound 2 s in 2 steps of 1 s, credit $0.095/s per prompt token at the
bound.

- ``old``: 100 tokens, bids $0.8/s, arrives at 0 s. Key = (bid + credit) / 100 tokens.
- ``a``, ``b``, ``c``: 10 tokens, bid $1/s each (key 1/10 = 0.1), arrive at 0.5, 1.5, 1.9 s.

Round at 1.0 s: ``old`` has waited 1 s, level 1 of 2: credit 0.095 x 100 x 1/2 = $4.75/s, key
(4.75 + 0.8) / 100 = 0.0555 < 0.1: ``a`` goes first.
Round at 2.0 s: level 2: credit $9.5/s, key (9.5 + 0.8) / 100 = 0.103 > 0.1: ``old`` goes
first, ahead of ``b`` and ``c``. Its bid buys that: at bid z its key is (9.5 + z) / 100, which
passes 0.1 from z = $0.5/s on; passing them saves it their 20 tokens, 0.2 s. Its charge is the
critical bid times the time saved, 0.5 x 0.2 = $0.10 (equally: the 1.0 s it delays each of
``b`` and ``c`` at $1/s, $2.0, less its own credit times the time saved, 9.5 x 0.2 = $1.9).
Without the bound ``old`` (key 0.008) waits behind all three.
"""

from __future__ import annotations

import pytest

from engines.contract.control import ControlState
from engines.contract.knobs import MarketKnobs
from engines.contract.records import round_record_checked, round_record_dumps, round_record_loads
from engines.sim import Engine, EngineConfig, SimRequest
from mechanism import reference as ref

POLICY = "dfs-auction-density"
WAIT_S, STEPS, DENSITY = 2.0, 2, 0.095
ONE_AT_A_TIME = EngineConfig(max_running_requests=1)
KNOBS = MarketKnobs(tokens_per_second=100.0, overhead_tokens=0, in_batch_defer_tokens=0)
BOUND = {"wait_bound_s": WAIT_S, "wait_steps": STEPS, "wait_density": DENSITY}


def request(rid: str, first: int, n: int, bid: float, arrival: float) -> SimRequest:
    return SimRequest(rid, tuple(range(first, first + n)), 1, bid, arrival)


OLD = ("old", 1000, 100, 0.8, 0.0)
A, B, C = ("a", 2000, 10, 1.0, 0.5), ("b", 3000, 10, 1.0, 1.5), ("c", 4000, 10, 1.0, 1.9)


def admitted(engine: Engine, now: float) -> str:
    """Run the step at ``now``: one round, one request admitted (and answered)."""
    result = engine.step(now)
    assert result is not None and result.record is not None
    (entry,) = result.record["admitted"]
    return entry["request_id"]


def test_an_old_request_is_served_ahead_after_the_bound_and_not_before() -> None:
    engine = Engine(ONE_AT_A_TIME, POLICY, knobs=MarketKnobs(**{**vars(KNOBS), **BOUND}))
    for spec in (OLD, A):
        engine.submit(request(*spec))
    assert admitted(engine, 1.0) == "a"  # old at level 1: still behind
    for spec in (B, C):
        engine.submit(request(*spec))
    result = engine.step(2.0)
    (entry,) = result.record["admitted"]
    assert entry["request_id"] == "old"  # at the bound: ahead of b and c
    assert [admitted(engine, 2.1), admitted(engine, 2.2)] == ["b", "c"]
    assert entry["charge"] == pytest.approx(0.10)
    assert entry["time_saved_s"] == pytest.approx(0.2)
    assert entry["bid"] == 0.8  # the record's bid is the bid, not the credit
    assert entry["age_credit"] == 9.5  # $/s: the record tells an aged request from a bid
    round_record_loads(round_record_dumps(result.record))  # a record settlement reads
    entry["age_credit"] = -1.0
    with pytest.raises(ValueError, match="age_credit must be an amount"):
        round_record_checked(result.record)

    # The reference, by brute force with the credits worked out by its own rule.
    reqs = [ref.Req(rid, tuple(range(f, f + n)), bid, t) for rid, f, n, bid, t in (OLD, B, C)]
    reqs = [
        ref.Req(r.id, r.tokens, r.bid, r.arrival, 0, ref.age_credit(r, 2.0, WAIT_S, DENSITY, STEPS))
        for r in reqs
    ]
    assert [r.credit for r in reqs] == pytest.approx([9.5, 0.0, 0.0])
    assert ref.reference_order(reqs, POLICY, 0.0, 0) == ["old", "b", "c"]
    charge, saved = ref.crossing_charge(reqs, "old", POLICY, 0.0, 0, 100.0)
    assert entry["charge"] == pytest.approx(charge)
    assert entry["time_saved_s"] == pytest.approx(saved)
    low, high, _ = ref.myerson_bounds(reqs, "old", POLICY, 0.0, 0, 100.0, steps=400)
    assert low - 1e-9 <= entry["charge"] <= high + 1e-9


def test_without_the_bound_the_old_request_waits_behind_every_newer_one() -> None:
    engine = Engine(ONE_AT_A_TIME, POLICY, knobs=KNOBS)
    for spec in (OLD, A):
        engine.submit(request(*spec))
    assert admitted(engine, 1.0) == "a"
    for spec in (B, C):
        engine.submit(request(*spec))
    records = [engine.step(t).record for t in (2.0, 2.1, 2.2)]
    assert [r["admitted"][0]["request_id"] for r in records] == ["b", "c", "old"]
    assert not any("age_credit" in r["admitted"][0] for r in records)  # none without the bound


def test_only_the_dfs_auctions_use_the_bound() -> None:
    # highest-bid orders by bid alone: the credit changes nothing (b, c bid more than old).
    engine = Engine(ONE_AT_A_TIME, "highest-bid", knobs=MarketKnobs(**{**vars(KNOBS), **BOUND}))
    for spec in (OLD, B, C):
        engine.submit(request(*spec))
    assert [admitted(engine, t) for t in (5.0, 5.1, 5.2)] == ["b", "c", "old"]
    assert engine.wait_bound.credit is None


class Pushed:
    """A control follower whose next state is set by the test (the store's, as the engine
    takes it at a round's start)."""

    def __init__(self) -> None:
        self.state: ControlState | None = None

    def take(self) -> ControlState | None:
        state, self.state = self.state, None
        return state


def test_a_bound_pushed_at_run_time_applies_from_the_next_round() -> None:
    control = Pushed()
    engine = Engine(
        ONE_AT_A_TIME,
        POLICY,
        knobs=MarketKnobs(**{**vars(KNOBS), "wait_steps": STEPS, "wait_density": DENSITY}),
        control=control,  # type: ignore[arg-type]
    )
    for spec in (OLD, ("d", 5000, 100, 0.8, 0.05), B, C):
        engine.submit(request(*spec))
    # Off: at 2.0 s old and d have waited the bound's time but have no credit; b goes first.
    assert admitted(engine, 2.0) == "b"
    # The market turns the bound on: the next round gives old and d their whole credit at once
    # (both have waited >= 2 s; key 0.103 > c's 0.1), old first (it arrived first).
    control.state = ControlState(POLICY, 0.0, wait_bound_s=WAIT_S)
    assert admitted(engine, 2.1) == "old"
    assert engine.knobs.wait_bound_s == WAIT_S
    assert engine.tree.entries["d"].credit == 9_500_000_000  # $9.5/s in ticks
    # Turned off again: the credit given is taken back at the next round; c passes d.
    control.state = ControlState(POLICY, 0.0, wait_bound_s=0.0)
    assert admitted(engine, 2.2) == "c"
    assert engine.tree.entries["d"].credit == 0 and engine.wait_bound.credit is None
