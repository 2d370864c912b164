"""Workloads: deterministic for a seed, with the requested shapes and sharing structure."""

from __future__ import annotations

import statistics
from collections import Counter

import pytest

from benchmarks.bids import BidSpec
from benchmarks.workloads import agents, gsp, nosharing


def _group(rid: str) -> int:
    return int(rid[1:5])


def test_gsp_is_deterministic_for_a_seed() -> None:
    a, b = (
        gsp(num_groups=4, prompts_per_group=3, seed=7),
        gsp(num_groups=4, prompts_per_group=3, seed=7),
    )
    assert a.requests == b.requests
    c = gsp(num_groups=4, prompts_per_group=3, seed=8)
    assert [r.tokens for r in a.requests] != [r.tokens for r in c.requests]


def test_gsp_uniform_shape_and_sharing() -> None:
    w = gsp(
        num_groups=5,
        prompts_per_group=4,
        system_prompt_len=50,
        question_len=7,
        output_len=9,
        seed=1,
    )
    assert len(w.requests) == w.requests_total == 20
    assert Counter(_group(r.id) for r in w.requests) == {g: 4 for g in range(5)}
    assert all(len(r.tokens) == 57 and r.max_new_tokens == 9 for r in w.requests)
    systems: dict[int, tuple[int, ...]] = {}
    questions = set()
    for r in w.requests:
        # every request of a group starts with the group's system prompt
        assert systems.setdefault(_group(r.id), r.tokens[:50]) == r.tokens[:50]
        questions.add(r.tokens[50:])
    assert len(set(systems.values())) == 5  # groups do not share
    assert len(questions) == 20  # questions are private
    # shuffled: the groups do not come in blocks
    order = [_group(r.id) for r in w.requests]
    assert order != sorted(order)


def test_gsp_zipf_keeps_the_total_and_favours_the_first_groups() -> None:
    w = gsp(
        num_groups=8,
        prompts_per_group=50,
        system_prompt_len=4,
        question_len=2,
        popularity="zipf",
        zipf_s=1.2,
        seed=3,
    )
    counts = Counter(_group(r.id) for r in w.requests)
    assert sum(counts.values()) == 400
    assert counts[0] > 2 * counts[7]


def test_gsp_rejects_bad_knobs() -> None:
    with pytest.raises(ValueError, match="num_groups"):
        gsp(num_groups=0)
    with pytest.raises(ValueError, match="popularity"):
        gsp(popularity="pareto")


def test_two_class_bids_share_and_classes() -> None:
    w = gsp(num_groups=10, prompts_per_group=100, system_prompt_len=2, question_len=2, seed=0)
    urgent = [r.bid for r in w.requests if r.bid_class == "urgent"]
    background = [r.bid for r in w.requests if r.bid_class == "background"]
    assert len(urgent) + len(background) == 1000
    assert 150 < len(urgent) < 250
    # medians of lognormal(1, 1) and lognormal(-2, 1): e and e^-2
    assert 2.0 < statistics.median(urgent) < 3.6
    assert 0.10 < statistics.median(background) < 0.17


def test_nosharing_prompts_are_independent() -> None:
    w = nosharing(num_requests=30, prompt_len=20, output_len=5, bids=BidSpec("constant", 0.3))
    assert len(w.requests) == 30
    assert all(len(r.tokens) == 20 and r.max_new_tokens == 5 for r in w.requests)
    assert len({r.tokens[:4] for r in w.requests}) == 30
    assert {(r.bid, r.bid_class) for r in w.requests} == {(0.3, "all")}


def test_agent_turns_grow_by_output_and_message() -> None:
    w = agents(sessions=2, turns=3, prefix_len=10, message_len=3, output_len=4, think_s=1.5)
    assert w.requests_total == 6
    s = w.sessions[0]
    assert w.sessions[1].prefix == s.prefix  # one shared tool/system prefix
    first = s.first_turn()
    assert first.tokens == s.prefix + s.messages[0]
    output = (9, 9, 9, 9)
    second = s.next_turn(0, first.tokens, output, finished_at=5.0)
    assert second.tokens == first.tokens + output + s.messages[1]
    assert second.arrival == 5.0 + s.think_s[0]
    assert second.bid == first.bid and second.bid_class == first.bid_class
    third = s.next_turn(1, second.tokens, output, finished_at=9.0)
    assert third is not None and s.next_turn(2, third.tokens, output, 12.0) is None


def test_poisson_arrivals_scale_with_the_rate() -> None:
    w = gsp(num_groups=20, prompts_per_group=50, system_prompt_len=2, question_len=2)
    slow, fast = w.at_rate(10.0, seed=0), w.at_rate(20.0, seed=0)
    times = [r.arrival for r in slow.requests]
    assert times == sorted(times) and times[0] > 0
    assert 0.09 < times[-1] / len(times) < 0.11  # mean gap 1 / rate
    assert [r.arrival for r in fast.requests] == pytest.approx([t / 2 for t in times])
    assert {r.arrival for r in slow.all_at_once().requests} == {0.0}
    # the content does not move
    assert [r.tokens for r in slow.requests] == [r.tokens for r in w.requests]


def test_agent_sessions_start_at_rate_over_turns() -> None:
    w = agents(sessions=400, turns=4, prefix_len=2, message_len=1, output_len=1)
    starts = [s.start for s in w.at_rate(8.0, seed=0).sessions]
    assert 0.45 < starts[-1] / len(starts) < 0.55  # 8 requests/s = 2 sessions/s
    once = w.all_at_once()
    assert {s.start for s in once.sessions} == {0.0}
    assert {t for s in once.sessions for t in s.think_s} == {0.0}
