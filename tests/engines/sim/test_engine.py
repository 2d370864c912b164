"""The simulated engine's accounting, against hand-worked cases.

A toy cost model keeps the arithmetic readable: a step costs 1 s, plus 0.1 s per prefilled token,
plus 0.01 s per decoding sequence; no attention or context terms.
"""

import pytest

from engines.sim import Engine, EngineConfig, SimRequest
from engines.sim.driver import ArrivalQueue, run_virtual

TOY = EngineConfig(
    step_fixed_s=1.0,
    prefill_token_s=0.1,
    prefill_attention_s=0.0,
    decode_seq_s=0.01,
    decode_context_token_s=0.0,
    kv_capacity_tokens=10_000,
    max_running_requests=64,
    max_prefill_tokens=1_000,
    chunked_prefill_size=1_000,
)


def req(rid, tokens, max_new=2, bid=0.0, arrival=0.0):
    return SimRequest(rid, tuple(tokens), max_new, bid, arrival)


def run(engine, requests):
    done = []
    run_virtual(engine, ArrivalQueue(requests), on_finished=done.append)
    return {r.id: r for r in done}


def test_a_lone_request_prefills_then_decodes():
    # Step 1 (prefill, 10 tokens): 1 + 10 x 0.1 = 2 s; first token at 2.  max_new 3 -> two decode
    # steps of 1 + 0.01 = 1.01 s: finished at 4.02.
    e = Engine(TOY, "fcfs")
    r = run(e, [req("a", range(10), max_new=3)])["a"]
    assert r.first_token_at == pytest.approx(2.0)
    assert r.finished_at == pytest.approx(4.02)
    assert r.generated == 3 and len(r.output) == 3
    assert (e.prompt_tokens, e.cached_prompt_tokens, e.prefilled_tokens) == (10, 0, 10)


def test_cache_hits_count_the_shared_prefix_and_never_the_last_token():
    e = Engine(TOY, "fcfs")
    a = run(e, [req("a", range(10))])["a"]
    # Same first 6 tokens: 6 cached.  Identical prompt: all but the last token (9).  The answer
    # is cached too: a follow-up turn finds prompt + output (10 + 2 = 12 tokens).
    later = run(
        e,
        [
            req("b", [*range(6), 50, 51, 52, 53], arrival=10),
            req("c", range(10), arrival=11),
            req("d", [*range(10), *a.output, 77, 78], arrival=12),
        ],
    )
    assert later["b"].cached_tokens == 6
    assert later["c"].cached_tokens == 9
    assert later["d"].cached_tokens == 12
    assert e.cache_hit_rate == pytest.approx((0 + 6 + 9 + 12) / (10 + 10 + 10 + 14))


def test_token_budget_chunks_the_request_that_does_not_fit():
    # Budget 8 tokens per step.  R1 (5) fits; R2 (6) gets the 3 left: a chunk.  Step 1 prefills 8
    # tokens: 1.8 s.  Step 2 finishes R2's prefill (3 tokens): 1.3 s.  R1 waits for its first
    # decode until step 3: prefill steps and decode steps take turns.
    cfg = EngineConfig(**{**TOY.__dict__, "max_prefill_tokens": 8, "chunked_prefill_size": 8})
    e = Engine(cfg, "fcfs")
    steps = []
    done = []
    run_virtual(
        e,
        ArrivalQueue([req("r1", range(5)), req("r2", range(100, 106), arrival=0)]),
        on_step=steps.append,
        on_finished=done.append,
    )
    assert [(s.kind, s.prefill_tokens) for s in steps[:3]] == [
        ("prefill", 8),
        ("prefill", 3),
        ("decode", 0),
    ]
    r = {x.id: x for x in done}
    assert r["r1"].first_token_at == pytest.approx(1.8)
    assert r["r2"].first_token_at == pytest.approx(1.8 + 1.3)
    assert r["r1"].finished_at == pytest.approx(3.1 + 1.02)  # one decode step of two sequences


def test_lru_eviction_frees_the_least_recently_used_prefix():
    # Capacity 40.  A then B finish: each leaves a prompt node (10 tokens) with its answer (2) as
    # a leaf below it: 24 tokens cached.  C needs 25 + 5 = 30: 24 + 30 - 40 = 14 must go, leaf by
    # leaf, least recently used first: A's answer (2), then A's prompt, now a leaf (10), then
    # B's answer (2).  B's prompt stays: 10 + C's 30 = 40 cached.
    cfg = EngineConfig(**{**TOY.__dict__, "kv_capacity_tokens": 40})
    e = Engine(cfg, "fcfs")
    run(e, [req("a", range(10)), req("b", range(20, 30), arrival=5)])
    assert e.kv.size == 24
    run(e, [req("c", range(100, 125), max_new=5, arrival=20)])
    assert e.kv.size == 40
    again = run(e, [req("b2", range(20, 30), arrival=40), req("a2", range(10), arrival=41)])
    assert again["a2"].cached_tokens == 0
    assert again["b2"].cached_tokens == 9


def test_lru_keeps_the_recently_used_prefix():
    # Capacity 40: A then B cached.  A is used again (a hit on its first 9 tokens, which splits
    # its prompt node, and a second answer below it): 26 tokens.  C needs 17 + 3 = 20: 6 must
    # go, least recently used first: A's old answer (2), B's answer (2), then B's prompt (10),
    # older than A's refreshed path.  A stays cached, B does not.
    cfg = EngineConfig(**{**TOY.__dict__, "kv_capacity_tokens": 40})
    e = Engine(cfg, "fcfs")
    run(e, [req("a", range(10)), req("b", range(20, 30), arrival=5)])
    run(e, [req("a-again", range(10), arrival=10)])  # touches A's path
    run(e, [req("c", range(100, 117), max_new=3, arrival=20)])
    got = run(e, [req("a3", range(10), arrival=40), req("b3", range(20, 30), arrival=41)])
    assert got["a3"].cached_tokens == 9
    assert got["b3"].cached_tokens == 0


def test_head_of_line_blocking():
    # Capacity 60.  R0 runs with a big reservation (10 prompt + 30 output = 40).  Then X (15
    # tokens + 10 out = 25, first in fcfs order) does not fit beside it (40 + 25 + 1 > 60) while
    # Y (3 + 2 = 5) would: Y must still wait behind X.
    cfg = EngineConfig(**{**TOY.__dict__, "kv_capacity_tokens": 60})
    e = Engine(cfg, "fcfs")
    e.submit(req("r0", range(10), max_new=30))
    first = e.step(0.0)
    assert first.kind == "prefill"
    e.submit(req("x", range(100, 115), max_new=10, arrival=first.end))
    e.submit(req("y", range(200, 203), max_new=2, arrival=first.end))
    nxt = e.step(first.end)
    assert nxt.kind == "decode"  # nothing admitted: X blocks the line, Y waits behind it
    assert set(e.waiting) == {"x", "y"}


def test_charges_come_from_the_admitting_round():
    # One request at a time (max_running 1).  A (bid 1) and B (bid 3), 10 distinct tokens each,
    # overhead 1 token: highest-bid admits B first.  At bid 0 B would wait for A (11 tokens of
    # work); it passes A once its bid exceeds 1, so T = 11 tokens / tps and
    # p_B = 3 T - integral_0^3 T(z) dz = 3 T - 2 T = T = 11 / tps dollars.
    # A is admitted in a later round, alone: it pays 0.
    cfg = EngineConfig(**{**TOY.__dict__, "max_running_requests": 1})
    tps = cfg.prefill_tokens_per_second
    e = Engine(cfg, "highest-bid")
    records = []
    done = []
    run_virtual(
        e,
        ArrivalQueue([req("a", range(10), bid=1.0), req("b", range(50, 60), bid=3.0)]),
        on_step=lambda s: s.record and records.append(s.record),
        on_finished=done.append,
    )
    r = {x.id: x for x in done}
    assert r["b"].admitted_at < r["a"].admitted_at
    assert r["b"].charge == pytest.approx(11 / tps)
    assert r["b"].time_saved_s == pytest.approx(11 / tps)
    assert r["b"].planned_completion_s == pytest.approx(11 / tps)
    assert r["a"].charge == 0.0
    assert [[a["request_id"] for a in rec["admitted"]] for rec in records] == [["b"], ["a"]]
    assert records[0]["admitted"][0]["charge"] == pytest.approx(11 / tps)
    assert records[0]["waiting"] == 2 and records[1]["waiting"] == 1


def test_rank_is_the_place_in_line_when_a_round_first_ordered_the_request():
    # One 10-token prefill per step (budget 10 tokens), steps of 1 + 10 x 0.1 = 2 s; the plan's
    # work is the uncached tokens plus 1 overhead token a request; dfs-auction-density orders
    # sibling subtrees by bid sum / work.
    # t=0: p1 and p2 share 8 tokens (a subtree of work 8 + (2+1) + (2+1) = 14 tokens, bids
    # 0.06 + 0 -> 0.00429 $/s a token); b, d, c, a stand alone (11 tokens each: 0.04/11 =
    # 0.00364, 0.03/11 = 0.00273, 0.02/11 = 0.00182, 0.01/11 = 0.00091). Inside the shared
    # subtree p1 (0.06) goes before p2 (0). Plan of round 1: p1 p2 b d c a -> ranks 1..6 of 6,
    # although p2 bids nothing: its prefix goes first. Round 1 admits p1.
    # t=0.5: e (0.05) and f (0.015) arrive, first ordered by round 2 at t=2, where p2's shared
    # 8 tokens are cached (work 2 + 1 = 3, bid 0: last) and e = 0.05/11 = 0.00455,
    # f = 0.015/11 = 0.00136: e b d c f a p2 -> e 1 of 7, f 5 of 7.
    cfg = EngineConfig(**{**TOY.__dict__, "max_prefill_tokens": 10, "chunked_prefill_size": 10})
    e = Engine(cfg, "dfs-auction-density")
    shared = list(range(100, 108))
    requests = [
        req("p1", [*shared, 200, 201], bid=0.06),
        req("p2", [*shared, 300, 301], bid=0.0),
        req("a", range(10, 20), bid=0.01),
        req("b", range(20, 30), bid=0.04),
        req("c", range(30, 40), bid=0.02),
        req("d", range(40, 50), bid=0.03),
        req("e", range(50, 60), bid=0.05, arrival=0.5),
        req("f", range(60, 70), bid=0.015, arrival=0.5),
    ]
    r = run(e, requests)
    got = {rid: (x.rank, x.auction["ahead"], x.auction["queue_len"]) for rid, x in r.items()}
    assert got == {
        "p1": (1, 0, 6),
        "p2": (2, 1, 6),
        "b": (3, 2, 6),
        "d": (4, 3, 6),
        "c": (5, 4, 6),
        "a": (6, 5, 6),
        "e": (1, 0, 7),
        "f": (5, 4, 7),
    }
    # The place in the round that admitted it says nothing here: each was at the front.
    assert {x.position for x in r.values()} == {0}


def test_dfs_auction_defers_a_second_request_sharing_an_uncached_prefix():
    # P and Q share 40 uncached tokens; computing them twice in one batch would waste 40 tokens,
    # so Q waits one step and then finds them cached.  fcfs admits both at once (as SGLang does)
    # and computes the shared prefix twice.
    shared = list(range(1000, 1040))
    reqs = [req("p", [*shared, 1]), req("q", [*shared, 2])]
    auction = Engine(TOY, "dfs-auction")
    got = run(auction, reqs)
    assert got["q"].cached_tokens == 40 and got["q"].admitted_at > 0
    assert auction.prefilled_tokens == 41 + 1
    naive = Engine(TOY, "fcfs")
    run(naive, [req("p", [*shared, 1]), req("q", [*shared, 2])])
    assert naive.prefilled_tokens == 41 + 41


@pytest.mark.parametrize(
    ("policy", "first"), [("dfs-auction-density", "b"), ("dfs-auction-kv", "a")]
)
def test_dfs_auction_kv_keeps_a_cached_prefix_ahead_of_a_denser_uncached_request(policy, first):
    # A warm-up caches the 20-token prefix P. Then, one request running at a time: A = P + 1
    # token (20 cached, work 1 + 1 overhead = 2) bids 1; B = 21 new tokens (work 22) bids 16.
    # Densities: A 1/2 = 0.5, B 16/22 = 0.73, so dfs-auction-density admits B first. dfs-auction-kv
    # counts A's work as 2/4 (its edge is cached): key 2 > 0.73, A first. A then passes B at the
    # bid z where z / 0.5 = 16/22, z = 8/22 $/s, for B's 22 tokens: it pays 8 tokens' worth.
    cfg = EngineConfig(**{**TOY.__dict__, "max_running_requests": 1})
    tps = cfg.prefill_tokens_per_second
    e = Engine(cfg, policy)
    prefix = list(range(20))
    run(e, [req("warm", [*prefix, 9])])
    got = run(
        e,
        [
            req("a", [*prefix, 7], bid=1.0, arrival=100.0),
            req("b", range(500, 521), bid=16.0, arrival=100.0),
        ],
    )
    assert got["a"].cached_tokens == 20
    second = "b" if first == "a" else "a"
    assert got[first].admitted_at < got[second].admitted_at
    if policy == "dfs-auction-kv":
        assert got["a"].charge == pytest.approx(8 / tps)
        assert got["a"].time_saved_s == pytest.approx(22 / tps)
        assert got["b"].charge == 0.0


@pytest.mark.parametrize(
    ("policy", "second"), [("dfs-auction-kv", "a2"), ("dfs-auction-kv-split", "b")]
)
def test_dfs_auction_kv_split_lets_a_cached_groups_background_request_wait(policy, second):
    # A warm-up caches the 20-token prefix P. Then, two requests running at a time: A1 = P + 1
    # token bids 1 and A2 = P + 1 other token bids 0.01 (20 cached each, work 1 + 1 overhead =
    # 2); B = 21 new tokens (work 22) bids 16. dfs-auction-kv keeps P's subtree (fully cached)
    # together, boosted: key (1.01) / (4 / 4) = 1.01 > B's 16 / 22 = 0.727, so A1 and A2 are
    # admitted first. dfs-auction-kv-split serves the blocks of P's subtree among the root's,
    # each boosted: A1 1 / (2 / 4) = 2, B 0.727, A2 0.02: A1 and B first, A2 waits.
    # Split charges (all three in the first round): A1 passes B at the bid z where 2z = 16/22,
    # z = 8/22, for B's 22 tokens (8 tokens' worth), and A2 at 2z = 0.02, z = 0.01, for A2's
    # 2 tokens (0.02 tokens' worth); B passes A2 at z / 22 = 0.02, z = 0.44, for 2 tokens.
    cfg = EngineConfig(**{**TOY.__dict__, "max_running_requests": 2})
    tps = cfg.prefill_tokens_per_second
    e = Engine(cfg, policy)
    prefix = list(range(20))
    run(e, [req("warm", [*prefix, 9])])
    got = run(
        e,
        [
            req("a1", [*prefix, 7], bid=1.0, arrival=100.0),
            req("a2", [*prefix, 8], bid=0.01, arrival=100.0),
            req("b", range(500, 521), bid=16.0, arrival=100.0),
        ],
    )
    third = "b" if second == "a2" else "a2"
    assert got["a1"].admitted_at == got[second].admitted_at < got[third].admitted_at
    if policy == "dfs-auction-kv-split":
        assert got["a1"].charge == pytest.approx(8.02 / tps)
        assert got["b"].charge == pytest.approx(0.88 / tps)
        assert got["a2"].charge == 0.0


def test_bad_requests_are_refused_with_their_id():
    e = Engine(TOY, "fcfs")
    with pytest.raises(ValueError, match="'z'.*bid"):
        e.submit(req("z", [1, 2], bid=-1.0))
    with pytest.raises(ValueError, match="'big'.*KV"):
        e.submit(req("big", range(20_000)))
    with pytest.raises(ValueError, match="'m'.*max_new_tokens"):
        e.submit(req("m", [1], max_new=0))
    e.submit(req("ok", [1, 2]))
    with pytest.raises(ValueError, match="duplicate"):
        e.submit(req("ok", [3]))
    assert list(e.waiting) == ["ok"]


def test_cancel_removes_a_waiting_request():
    e = Engine(TOY, "dfs-auction-density")
    e.submit(req("a", [1, 2, 3]))
    assert e.cancel("a") and not e.cancel("a")
    assert e.idle and e.step(0.0) is None


def test_tenant_level_charges_need_the_owners_and_match_the_brute_force():
    # Three prompts arriving together, one round admits all: a and b are tenant x's, c tenant
    # y's. With charge_scope "tenant", a is not billed for delaying b; the charges equal the
    # brute-force reference's (delay on the other tenants' requests) at the engine's rate.
    from engines.contract.knobs import MarketKnobs
    from mechanism import reference as ref
    from mechanism.reference import Req

    spec = [("a", (1, 2, 3), 3.0, "x"), ("b", (4, 5), 2.0, "x"), ("c", (6, 7, 8, 9), 1.0, "y")]
    charges = {}
    for scope in ("request", "tenant"):
        e = Engine(TOY, "dfs-auction-density", knobs=MarketKnobs(charge_scope=scope))
        records: list = []
        queue = ArrivalQueue([SimRequest(r, t, 2, b, 0.0, owner=o) for r, t, b, o in spec])
        run_virtual(e, queue, on_step=lambda s, got=records: s.record and got.append(s.record))
        (first,) = [r for r in records if r["admitted"]]
        charges[scope] = {a["request_id"]: a["charge"] for a in first["admitted"]}
        tps, overhead = e.tokens_per_second, e.knobs.overhead_tokens
    reqs = [Req(r, t, b, 0.0) for r, t, b, _ in spec]
    owners = {r: o for r, _, _, o in spec}
    for rid in owners:
        expected = ref.tenant_payment(reqs, rid, owners, "dfs-auction-density", 0.0, overhead, tps)
        assert charges["tenant"][rid] == pytest.approx(expected, abs=1e-12)
        assert charges["request"][rid] == pytest.approx(
            ref.vcg_payment(reqs, rid, 0.0, overhead, tps), abs=1e-12
        )
    assert charges["tenant"]["a"] < charges["request"]["a"]  # b's delay is no longer billed
