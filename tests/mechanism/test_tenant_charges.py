"""Tenant-level charges (``charge_scope="tenant"``): a request is not billed for the delay it
imposes on its own tenant's other requests. Against a hand-worked queue and the brute force."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanism import WaitingRequest, clear
from mechanism import reference as ref

from .strategies import queues

OWNERS = st.lists(st.sampled_from(["x", "y", ""]), min_size=6, max_size=6)


def test_a_hand_worked_queue():
    # Three one-token prompts (1 token of work each), tokens_per_second 1. Density order a, b, c.
    # a at bid 0 would go last: it delays b (bid 2) and c (bid 1) by 1 s each. The standard
    # charge bills both: 3; a's tenant x owns b, so the tenant-level charge bills only c: 1.
    # b at bid 0 goes behind c: it delays c (tenant y) by 1 s at bid 1: 1 either way.
    reqs = [
        WaitingRequest("a", (1,), 3.0, 0.0, owner="x"),
        WaitingRequest("b", (2,), 2.0, 0.0, owner="x"),
        WaitingRequest("c", (3,), 1.0, 0.0, owner="y"),
    ]
    standard = clear(reqs, "dfs-auction-density", tokens_per_second=1.0)
    tenant = clear(reqs, "dfs-auction-density", tokens_per_second=1.0, charge_scope="tenant")
    assert standard.order == tenant.order == ["a", "b", "c"]
    assert standard.payments == pytest.approx({"a": 3.0, "b": 1.0, "c": 0.0})
    assert tenant.payments == pytest.approx({"a": 1.0, "b": 1.0, "c": 0.0})
    assert tenant.charge("a") == pytest.approx(1.0)


def test_without_owners_nothing_changes():
    reqs = [
        WaitingRequest("a", (1, 2), 3.0, 0.0),
        WaitingRequest("b", (1, 3), 2.0, 1.0),
        WaitingRequest("c", (4,), 1.0, 2.0),
    ]
    for policy in ("dfs-auction", "dfs-auction-density"):
        a = clear(reqs, policy, tokens_per_second=1.0, overhead_tokens=1)
        b = clear(reqs, policy, tokens_per_second=1.0, overhead_tokens=1, charge_scope="tenant")
        assert a.payments == pytest.approx(b.payments)


def test_an_unknown_scope_is_refused():
    with pytest.raises(ValueError, match="charge scope"):
        clear([WaitingRequest("a", (1,), 1.0, 0.0)], "dfs-auction-density", charge_scope="x")


@settings(max_examples=200, deadline=None)
@given(queues(max_size=6), OWNERS, st.sampled_from([0, 0, 1, 3]))
def test_density_tenant_charge_is_the_delay_on_other_tenants(reqs, owners, overhead):
    by_id = {r.id: o for r, o in zip(reqs, owners, strict=False)}
    mech = [
        WaitingRequest(r.id, r.tokens, r.bid, r.arrival, r.cached_len, owner=by_id[r.id])
        for r in reqs
    ]
    c = clear(
        mech,
        "dfs-auction-density",
        overhead_tokens=overhead,
        tokens_per_second=1.0,
        charge_scope="tenant",
    )
    for r in reqs:
        expected = ref.tenant_payment(reqs, r.id, by_id, "dfs-auction-density", 0.0, overhead, 1.0)
        assert c.payments[r.id] == pytest.approx(expected, abs=1e-9), r.id
        assert c.charge(r.id) == pytest.approx(expected, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    queues(max_size=5, max_len=4),
    OWNERS,
    st.sampled_from([0.0, 0.75, 2.0]),
    st.sampled_from(["dfs-auction", "dfs-auction-density"]),
)
def test_the_myerson_charge_less_the_delay_on_its_own_tenant(reqs, owners, reserve, policy):
    # dfs-auction's charge is Myerson's, not the externality; with a reserve, neither auction's.
    by_id = {r.id: o for r, o in zip(reqs, owners, strict=False)}
    mech = [
        WaitingRequest(r.id, r.tokens, r.bid, r.arrival, r.cached_len, owner=by_id[r.id])
        for r in reqs
    ]
    c = clear(mech, policy, reserve=reserve, tokens_per_second=1.0, charge_scope="tenant")
    for r in reqs:
        low, high, saved = ref.myerson_bounds(reqs, r.id, policy, reserve, 0, 1.0, steps=400)
        expected = ref.tenant_payment(reqs, r.id, by_id, policy, reserve, 0, 1.0)
        assert c.payments[r.id] == pytest.approx(expected, abs=(high - low) / 2 + 1e-9)
        if r.bid >= reserve:
            assert c.payments[r.id] >= reserve * saved - 1e-9


def test_a_tenant_charge_is_owed_where_the_standard_charge_is_zero():
    # Worked by hand. Under dfs-auction-density (overhead 0, 1 token/s) the root has two blocks:
    # [0] = r0 (cached, no work) + r3's leaf (1 token): bids 0.5 over work 1; and
    # [1] = r1, r2 (cached, no work) + r4's leaf (1 token): bids 0.75 over work 1. [1] goes
    # first. With r1 at 0, [1] has 0.5 / 1, a tie with [0], which the earlier tie (r0) wins: r1's
    # bid passes [0] at a critical bid of 0, so its standard charge is 0 (what it delays, r0 and
    # r3 by 1 token, 0.5 $, its own block gains back). Tenant-level, r0, r2 and r4 are its own
    # tenant's (x): r1 owes the delay on r3 (tenant y) alone, 0.25 $ x 1 s. Likewise r2 and r4.
    reqs = [
        WaitingRequest("r0", (0,), 0.25, 0.0, cached_len=1, owner="x"),
        WaitingRequest("r1", (1,), 0.25, 0.0, cached_len=1, owner="x"),
        WaitingRequest("r2", (1,), 0.25, 0.0, owner="x"),
        WaitingRequest("r3", (0, 0), 0.25, 0.0, owner="y"),
        WaitingRequest("r4", (1, 0), 0.25, 0.0, owner="x"),
    ]
    kw = {"tokens_per_second": 1.0, "overhead_tokens": 0}
    standard = clear(reqs, "dfs-auction-density", **kw)
    tenant = clear(reqs, "dfs-auction-density", charge_scope="tenant", **kw)
    assert standard.order == tenant.order == ["r1", "r2", "r4", "r0", "r3"]
    assert standard.payments == {"r1": 0.0, "r2": 0.0, "r4": 0.0, "r0": 0.0, "r3": 0.0}
    assert tenant.payments == pytest.approx(
        {"r1": 0.25, "r2": 0.25, "r4": 0.25, "r0": 0.0, "r3": 0.0}
    )
    assert tenant.charge("r1") == pytest.approx(0.25)
