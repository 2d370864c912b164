"""Workloads: deterministic for a seed, with the requested shapes and sharing structure."""

from __future__ import annotations

import math
import statistics
from collections import Counter

import pytest

from benchmarks.bids import BidSpec
from benchmarks.workloads import agents, chat, gsp, nosharing
from mechanism import RequestTree, WaitingRequest


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


def _quantile(sorted_values: list[int], q: float) -> float:
    """The ``q`` quantile of sorted values, by linear interpolation (statistics' 'inclusive')."""
    return statistics.quantiles(sorted_values, n=100, method="inclusive")[round(q * 100) - 1]


def test_chat_prompt_lengths_are_heavy_tailed_as_the_lognormal_says() -> None:
    w = chat(num_requests=20_000, conversations=2_000, system_prompt_len=64, median_len=256,
             sigma=1.25, seed=3)  # fmt: skip
    lengths = sorted(len(r.tokens) for r in w.requests)
    median = statistics.median(lengths)
    p99 = _quantile(lengths, 0.99)
    # Worked independently: the conversation part is lognormal with median 256 - 64 = 192, so
    # the p99 prompt is 64 + 192 exp(z99 x 1.25), z99 the standard normal 0.99 quantile.
    z99 = statistics.NormalDist().inv_cdf(0.99)
    expected_p99 = 64 + 192 * math.exp(z99 * 1.25)  # 3579 tokens
    assert median == pytest.approx(256, rel=0.03)
    assert p99 == pytest.approx(expected_p99, rel=0.10)
    assert p99 / median >= 10
    # the default workload's own sample is as heavy-tailed
    default = sorted(len(r.tokens) for r in chat(seed=0).requests)
    assert _quantile(default, 0.99) / statistics.median(default) >= 10


def test_chat_branches_from_one_system_prompt() -> None:
    w = chat(num_requests=300, conversations=40, system_prompt_len=32, median_len=80, seed=5)
    tree = RequestTree(
        [WaitingRequest(r.id, r.tokens, bid=r.bid, arrival=float(i))
         for i, r in enumerate(w.requests)]
    )  # fmt: skip
    (system,) = tree.root.children.values()  # one root: the system prompt
    assert (system.start, system.end) == (0, 32)
    assert system.reqs == {}  # no request is the system prompt alone
    used = {r.id[:5] for r in w.requests}
    assert len(system.children) == len(used)  # one branch per conversation
    assert 30 <= len(used) <= 40
    # A conversation's turns come in order, each extending the one before.
    last: dict[str, tuple[int, tuple[int, ...]]] = {}
    for r in w.requests:
        conv, turn = r.id[:5], int(r.id[7:10])
        before_turn, before = last.get(conv, (-1, ()))
        assert turn == before_turn + 1
        assert r.tokens[: len(before)] == before
        last[conv] = (turn, r.tokens)


def test_chat_is_deterministic_and_refuses_bad_shapes() -> None:
    assert chat(num_requests=50, seed=2).requests == chat(num_requests=50, seed=2).requests
    assert chat(num_requests=50, seed=2).requests != chat(num_requests=50, seed=3).requests
    with pytest.raises(ValueError, match="median_len"):
        chat(system_prompt_len=300, median_len=256)
    with pytest.raises(ValueError, match="sigma"):
        chat(sigma=0)
    with pytest.raises(ValueError, match="conversations must be >= 1"):
        chat(conversations=0)
