"""Settlements written as one batch (``accounts.services.requests_settle``, the ledger store's
one statement for many requests) against the brute-force sequential reference: the same
requests settled one by one through the ORM reference ledger
(``tests.accounts.reference_ledger``), in the same order. Each request's result (its charges,
what cut them, or its error) and every counter row must come out the same, whatever mix of
requests that fit, requests a budget cuts, replays and requests that cannot be settled the
batch holds."""

from __future__ import annotations

import itertools
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts import ledger
from accounts.ledger import Settled, Usage
from accounts.models import BudgetCounter, Period, Request
from accounts.services import (
    BudgetExhausted,
    Served,
    api_key_create,
    budget_set,
    request_fail,
    request_open,
    request_settle,
    requests_settle,
    requests_settle_first,
)
from tests.accounts.factories import (
    NOW,
    counters_mismatches,
    decided_first_then_rest,
    market_create,
    priority_charge,
    tenant_create,
)
from tests.accounts.reference_ledger import ReferenceLedger

pytestmark = pytest.mark.django_db

D = Decimal
TENANT_LIMIT = D("0.01")
KEY_LIMIT = D("0.006")
# 100 prompt tokens at $3/M and 10 output tokens at $15/M: $0.00045 of tokens each.
USAGE = Usage(prompt_tokens=100, cached_tokens=0, completion_tokens=10)
_worlds = itertools.count()
_markets: dict[str, object] = {}  # each world's market, by its name

# One request of a batch: (which tenant, with the key?, its hold's priority part, the priority
# charge its engine reports (None: none), what happens to it before the batch).
request = st.tuples(
    st.sampled_from([0, 1]),
    st.booleans(),
    st.sampled_from(["0", "0.001", "0.003"]),
    st.sampled_from([None, "0", "0.0005", "0.002", "0.004", "0.009"]),
    st.sampled_from(["open", "open", "open", "failed", "settled", "unknown"]),
)


def _world(spec: list[tuple], name: str) -> tuple[list[str], list]:
    """Two tenants, each with a day budget and a key with its own; the requests of ``spec``
    opened (or not) as it says: their ids, and the tenants (the market: ``_markets[name]``)."""
    market = _markets[name] = market_create(f"m-{name}")
    tenants, keys = [], []
    for t in range(2):
        tenant = tenant_create(f"{name}-t{t}")
        budget_set(tenant=tenant, limit=TENANT_LIMIT, period=Period.DAY)
        key, _ = api_key_create(tenant=tenant, name="k", created_by=None, budget_limit=KEY_LIMIT)
        tenants.append(tenant)
        keys.append(key)
    ids = []
    for i, (t, keyed, hold, _, before) in enumerate(spec):
        rid = f"{name}-r{i}"
        ids.append(rid)
        if before == "unknown":
            continue
        try:
            request_open(
                request_id=rid, tenant=tenants[t], api_key=keys[t] if keyed else None,
                market=market, bid="0.001", hold_amount=D("0.0005") + D(hold),
                priority_cap=D("0.004"), now=NOW,
            )  # fmt: skip
        except BudgetExhausted:
            continue  # never opened: the settlement finds no request
        if before == "failed":
            request_fail(request_id=rid, now=NOW)
        elif before == "settled":
            request_settle(
                request_id=rid, prompt_tokens=1, cached_tokens=0, completion_tokens=1, now=NOW
            )
    return ids, tenants


def _seen(result: Settled | Exception) -> tuple:
    """What a settlement did, without the world's names and ids."""
    if isinstance(result, Exception):
        return (type(result).__name__,)
    entries = []
    for entry in (result.tokens, result.priority):
        if entry is None:
            entries.append(None)
            continue
        detail = entry.detail
        entries.append((entry.kind, entry.amount, detail.get("capped_by"), detail.get("uncapped")))
    return (result.outcome, *entries)


def _counters(tenants: list) -> list[tuple]:
    rows = BudgetCounter.objects.filter(tenant__in=tenants).order_by("tenant_id", "api_key_id")
    return [(r.api_key_id is None, r.held, r.spent_total, r.day_start, r.day_spent) for r in rows]


def _served(ids: list[str], spec: list[tuple], order: list[int], market=None) -> list[Served]:
    return [
        Served(
            ids[i],
            USAGE,
            None if spec[i][3] is None else priority_charge(spec[i][3], round_id=f"rd-{i}"),
            market,
        )
        for i in order
    ]


def settled_first_then_rest(*, served: list[Served], now) -> list[Settled | Exception]:
    """The batch as the gateway writes it (``batching.decided_first``), on Django's
    connection: ``requests_settle_first``, then ``requests_settle`` of those it left."""
    return decided_first_then_rest(
        requests_settle_first(served=served, now=now),
        lambda undecided: requests_settle(served=[served[k] for k in undecided], now=now),
    )


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    spec=st.lists(request, min_size=1, max_size=14),
    again=st.lists(st.integers(min_value=0, max_value=13), max_size=3),
)
@pytest.mark.parametrize("write", [requests_settle, settled_first_then_rest])
def test_a_batch_settles_as_the_reference_does_one_by_one(write, spec, again, monkeypatch) -> None:
    """Requests that fit and requests a budget cuts, several tenants and keys, duplicates
    inside the batch (``again``: a request's id asked a second time, later in the batch),
    replays of settled requests, failed and unknown ones: the batch's results and counters are
    the reference's, one request after another in the batch's order. Written by the store, or
    as the gateway writes it: the first statement alone, then the store for the rest."""
    n = next(_worlds)
    order = list(range(len(spec))) + [i for i in again if i < len(spec)]
    batched_ids, batched_tenants = _world(spec, f"b{n}")
    reference_ids, reference_tenants = _world(spec, f"s{n}")
    # The gateway settles with the market as it admitted the request (its prices known).
    market = _markets[f"b{n}"] if write is settled_first_then_rest else None
    batched = write(served=_served(batched_ids, spec, order, market), now=NOW)
    with monkeypatch.context() as patch:
        patch.setattr(ledger, "_LEDGER", ReferenceLedger())
        one_by_one = []
        for served in _served(reference_ids, spec, order):
            one_by_one.extend(requests_settle(served=[served], now=NOW))
    assert [_seen(r) for r in batched] == [_seen(r) for r in one_by_one]
    assert _counters(batched_tenants) == _counters(reference_tenants)
    for tenant in batched_tenants:
        assert counters_mismatches(tenant) == []
    statuses = dict(Request.objects.filter(request_id__in=batched_ids).values_list("pk", "status"))
    reference = dict(
        Request.objects.filter(request_id__in=reference_ids).values_list("pk", "status")
    )
    assert sorted(statuses.values()) == sorted(reference.values())


def test_a_batch_at_a_budgets_edge_by_hand(tenant, market) -> None:
    """Worked by hand: a tenant's day budget of $0.002, three requests each holding $0.0005
    ($0.0015 held, $0.0005 left) and each charged $0.00045 of tokens and $0.0006 of priority
    ($0.00105, over its hold by $0.00055), settled in one batch in the order r0, r1, r2:

    - r0: room = its hold 0.0005 + left 0.0005 = 0.001: tokens 0.00045, priority cut to
      0.00055 (the budget). Left after it: 0.002 - 0.001 spent - 0.001 held = 0.
    - r1: room = 0.0005 + 0: tokens 0.00045, priority cut to 0.00005. Left: 0.
    - r2: the same as r1. Spent 0.002, held 0: the budget exactly used up."""
    budget_set(tenant=tenant, limit=D("0.002"), period=Period.DAY)
    for i in range(3):
        request_open(
            request_id=f"e{i}", tenant=tenant, api_key=None, market=market, bid="0.001",
            hold_amount=D("0.0005"), now=NOW,
        )  # fmt: skip
    served = [Served(f"e{i}", USAGE, priority_charge("0.0006", round_id="rd")) for i in range(3)]
    results = requests_settle(served=served, now=NOW)
    paid = [
        (r.tokens.amount, r.priority.amount, r.priority.detail.get("capped_by")) for r in results
    ]
    assert paid == [
        (D("0.00045"), D("0.00055"), "budget"),
        (D("0.00045"), D("0.00005"), "budget"),
        (D("0.00045"), D("0.00005"), "budget"),
    ]
    counter = BudgetCounter.objects.get(tenant=tenant, api_key=None)
    assert (counter.held, counter.day_spent) == (D("0"), D("0.002"))
    assert counters_mismatches(tenant) == []


def test_a_batch_whose_counter_rows_are_missing_creates_them_once_and_settles_all(
    tenant, market
) -> None:
    """Three requests of one tenant, its counter rows gone (as before counters existed): the
    rows are created from the ledger and the holds, once, and all three are settled, each
    $0.00045 of tokens; the counters then equal the ledger."""
    budget_set(tenant=tenant, limit=D("1"), period=Period.DAY)
    for i in range(3):
        request_open(
            request_id=f"c{i}", tenant=tenant, api_key=None, market=market, bid="0",
            hold_amount=D("0.001"), now=NOW,
        )  # fmt: skip
    BudgetCounter.objects.all().delete()
    results = requests_settle(served=[Served(f"c{i}", USAGE) for i in range(3)], now=NOW)
    assert [r.tokens.amount for r in results] == [D("0.00045")] * 3
    counter = BudgetCounter.objects.get(tenant=tenant, api_key=None)
    assert (counter.held, counter.day_spent) == (D("0"), D("0.00135"))
    assert counters_mismatches(tenant) == []
