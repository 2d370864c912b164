"""The money invariants of docs/ledger.md, "The money rules", each against the writes that could
break it.

- **Never overspent**: for every budget and its window, spent + held <= limit, after every
  step, whatever the order and the delay of settlement (a priority charge settled before or
  after its request's token charge, replayed, for a request whose hold was released, across a
  window's end); an autobidder's budget likewise, under concurrent requests.
- **Never charged twice**: one entry per (request, kind), the counters the ledger's sums.
- **503 not charged**: a request that failed has no entry, whatever was settled for it.

The property tests replay random lives of requests against both implementations of the
ledger's writes (the store's single statements and the ORM reference in
``tests.accounts.reference_ledger``) and check the
invariants from the ledger and the holds themselves (``counters_mismatches`` re-sums them).
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts.models import (
    Autobidder,
    BidSource,
    ChargeKind,
    LedgerEntry,
    Period,
    RequestStatus,
)
from accounts.selectors import budget_statuses_for_tenant
from accounts.services import (
    BudgetExhausted,
    api_key_create,
    budget_set,
    hold_release,
    request_fail,
    request_open,
    request_settle,
)
from accounts.services.autobidder import (
    autobid,
    autobid_in_flight,
    autobid_uncollected,
    autobidder_configure,
)
from accounts.windows import window_for
from openai_api.gateway.admission import request_admit_for
from openai_api.gateway.selectors import caches_clear
from openai_api.gateway.validation import CompletionParams
from tests.accounts.factories import (
    MIDNIGHT,
    counters_mismatches,
    market_create,
    priority_charge,
    run_concurrently,
    tenant_create,
)
from tests.accounts.reference_ledger import reference_ledger_use

pytestmark = pytest.mark.django_db

D = Decimal
TENANT_LIMIT = D("0.01")
KEY_LIMIT = D("0.006")
START = MIDNIGHT - timedelta(seconds=40)  # each life crosses a day's end
STEP = timedelta(seconds=3)
RIDS = ["r0", "r1", "r2", "r3"]
_lives = itertools.count()

# One step of a request's life: (what, request, a number used as that step's amount).
step = st.tuples(
    st.sampled_from(["open", "open_key", "complete", "settle", "fail", "release"]),
    st.sampled_from(RIDS),
    st.sampled_from(["0", "0.0001", "0.0015", "0.003", "0.02"]),
)


@pytest.fixture(params=["single", "reference"])
def statements(request, monkeypatch) -> str:
    """Both implementations of the ledger's writes: the store's single statements, and the ORM
    reference they are checked against."""
    if request.param == "reference":
        reference_ledger_use(monkeypatch)
    return request.param


def over_budget(tenant, now) -> list[str]:
    """The budgets whose spent + held exceeds the limit at ``now``."""
    return [
        f"{s.scope} {s.period}: spent {s.spent} + held {s.held} > {s.limit}"
        for s in budget_statuses_for_tenant(tenant=tenant, now=now)
        if s.spent + s.held > s.limit
    ]


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(life=st.lists(step, min_size=1, max_size=24))
def test_no_order_or_delay_of_settlement_overspends_a_budget(statements, life) -> None:
    n = next(_lives)
    tenant = tenant_create(f"life{n}")
    market = market_create(f"life-{n}")
    budget_set(tenant=tenant, limit=TENANT_LIMIT, period=Period.DAY)
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None, budget_limit=KEY_LIMIT)
    caps: dict[str, Decimal] = {}
    failed: set[str] = set()
    for i, (what, rid, number) in enumerate(life):
        now = START + i * STEP
        rid = f"{n}-{rid}"
        amount = D(number)
        if what in ("open", "open_key"):
            # The gateway's hold: a token part of 0.0005 plus the priority cap.
            try:
                request_open(
                    request_id=rid, tenant=tenant, api_key=key if what == "open_key" else None,
                    market=market, bid="0.0001", hold_amount=D("0.0005") + amount,
                    priority_cap=amount, now=now,
                )  # fmt: skip
                caps.setdefault(rid, amount)
            except (BudgetExhausted, ValueError):
                pass  # refused, or the id is held for the other scope: nothing written
        elif what in ("complete", "settle"):
            # 100 prompt tokens at $3/M and 10 output at $15/M: 0.00045; "settle" with a
            # priority charge too: the engine's figure may be anything, the cap is the rule.
            priority = priority_charge(float(amount) * 1.5, round_id=f"rd-{rid}-{i}")
            try:
                request_settle(
                    request_id=rid, prompt_tokens=100, cached_tokens=0, completion_tokens=10,
                    priority=priority if what == "settle" else None, now=now,
                )  # fmt: skip
            except (LookupError, ValueError):
                pass  # never opened, or failed
        elif what == "fail":
            if request_fail(request_id=rid, now=now):
                failed.add(rid)
        else:  # a hold released early (a client gone, a stale hold swept)
            hold_release(request_id=rid, now=now)
        assert over_budget(tenant, now) == [], f"step {i}: {what} {rid} {number}"
    assert counters_mismatches(tenant) == []
    entries = LedgerEntry.objects.filter(tenant=tenant)
    for entry in entries.filter(kind=ChargeKind.PRIORITY):
        assert entry.amount <= caps[entry.request_id]
    assert not entries.filter(request_id__in=failed).exists()
    assert not entries.filter(request__status=RequestStatus.FAILED).exists()
    # A priority entry only for a served request, at most one of each kind.
    assert not entries.exclude(request__status=RequestStatus.SERVED).exists()
    kinds = list(entries.values_list("request_id", "kind"))
    assert len(kinds) == len(set(kinds))


def test_a_charge_after_its_hold_was_released_is_cut_to_what_the_budget_has_left(
    statements, tenant, market
) -> None:
    """A charge can exceed what was reserved for it (its hold released early, or sized below
    the charge). It is then cut to what the budget has left, and the entry says so. Tokens: 100
    prompt at $3/M + 10 output at $15/M = 0.00045."""
    budget_set(tenant=tenant, limit="0.01", period=Period.DAY)
    now = MIDNIGHT - timedelta(hours=1)

    def opened(rid, hold, cap):
        request_open(request_id=rid, tenant=tenant, api_key=None, market=market, bid="0.001",
                     hold_amount=hold, priority_cap=cap, now=now)  # fmt: skip

    def settled(rid, charge, prompt=100, completion=10) -> LedgerEntry:
        request_settle(request_id=rid, prompt_tokens=prompt, cached_tokens=0,
                       completion_tokens=completion, priority=priority_charge(charge),
                       now=now)  # fmt: skip
        return LedgerEntry.objects.get(request_id=rid, kind=ChargeKind.PRIORITY)

    opened("a", "0.005", D("0.004"))
    opened("b", "0.005", D("0.004"))  # 0.005 + 0.005 = the whole 0.01
    hold_release(request_id="a", now=now)  # a's hold is released before a is settled
    # Nothing spent, held 0.005 (b): 0.005 left; a's 0.00045 + 0.004 fit and are charged in full.
    entry = settled("a", 0.004)
    assert entry.amount == D("0.004") and "capped_at" not in entry.detail
    hold_release(request_id="b", now=now)
    # Spent 0.00445, nothing held: 0.00555 left; b's tokens take 0.00045, then it asks 0.006
    # and its cap, 0.004, binds first.
    entry = settled("b", 0.006)
    assert (entry.amount, entry.detail["capped_by"]) == (D("0.004"), "priority_cap")
    # c holds the 0.0011 left with no priority cap recorded (opened outside the gateway). Spent
    # 0.0089: its room is its hold, 0.0011, and nothing more: its 0.003 is cut to 0.0011.
    opened("c", "0.0011", None)
    entry = settled("c", 0.003, prompt=0, completion=0)
    assert entry.amount == D("0.0011")
    assert entry.detail["capped_at"] == "0.001100000"
    assert (entry.detail["capped_by"], entry.detail["uncapped"]) == ("budget", "0.003000000")
    (status,) = budget_statuses_for_tenant(tenant=tenant, now=now)
    assert (status.spent, status.held, status.remaining) == (D("0.01"), D(0), D(0))
    assert counters_mismatches(tenant) == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_autobid_requests_at_the_edge_of_the_autobidders_budget(statements) -> None:
    """Issue 15: the safety rule at the budget level, under concurrency, on PostgreSQL.

    Budget $0.01 a day, value $0.001/s, max_wait 60 s (a worst case of $0.06 a request at the
    full value), exposure factor 0.1: a request in flight reserves a tenth of its worst case.
    Twenty requests are bid and opened from 20 connections at once, so several may see the
    same requests in flight; the engine asks $0.006 of each that bid, and the records are settled
    from 20 connections, each twice. The autobidder pays exactly min(budget, what was asked
    within the consent caps), never more, each request once, and what its budget cut is
    recorded and reported as given away."""
    tenant, market = tenant_create("auto"), market_create("auto-llm")
    budget_set(tenant=tenant, limit="100", period=Period.DAY)
    autobidder_configure(tenant=tenant, enabled=True, budget="0.01", period="day",
                         values={"interactive": "0.001"}, max_wait_s=60.0)  # fmt: skip
    Autobidder.objects.filter(tenant=tenant).update(exposure_factor=0.1)
    caches_clear()  # the gateway's market cache, from another test's database
    rids = [f"a{i}" for i in range(20)]

    def admit(rid: str) -> Decimal:  # the gateway's admission: bid, hold, open
        params = CompletionParams(
            endpoint="completions",
            model=market.served_model,
            max_tokens=1,
            stream=False,
            include_usage=False,
            request_class="interactive",
            bid=None,
            prompt_ids=(1, 2, 3),
        )
        got = request_admit_for(params=params, tenant=tenant, api_key=None, request_id=rid)
        assert got.bid_source == BidSource.AUTOBID
        return got.bid

    bids = run_concurrently([lambda r=r: admit(r) for r in rids])
    assert not [b for b in bids if isinstance(b, Exception)]
    # One admission at a time, each seeing the others in flight, in some order: 0.01 left, the
    # first bids the full 0.001 (worst case 0.06, reserved 0.006); the second may bid
    # (0.01 - 0.006) / (0.1 x 60) = 0.000666666; the third (0.01 - 0.006 - 0.004) = 0: nothing.
    assert sorted(bids) == [D(0)] * 18 + [D("0.000666666"), D("0.001")]
    bid_of = dict(zip(rids, bids, strict=True))
    priced = [rid for rid in rids if bid_of[rid] > 0]

    def settled(rid: str):  # the engine asks $0.006 of each request that bid
        charge = priority_charge(0.006, round_id=f"rd-{rid}") if rid in priced else None
        return request_settle(request_id=rid, prompt_tokens=0, cached_tokens=0,
                              completion_tokens=0, priority=charge)  # fmt: skip

    results = run_concurrently([lambda r=r: settled(r) for r in rids for _ in range(2)])
    assert not [r for r in results if isinstance(r, Exception)]
    entries = list(
        LedgerEntry.objects.filter(kind=ChargeKind.PRIORITY).values_list(
            "request_id", "amount", "detail"
        )
    )
    assert len(entries) == len(priced)  # each once, whatever was replayed
    consented = sum(min(D("0.006"), bid_of[r] * 60) for r, _, _ in entries)
    paid = sum(a for _, a, _ in entries)
    # Both asked 0.006 within their caps (0.06, 0.04): 0.012 asked, 0.01 paid, 0.002 cut.
    assert consented == D("0.012") and paid == D("0.01")
    tenant.autobidder.refresh_from_db()
    assert tenant.autobidder.spent_in_window == paid <= D("0.01")
    given_away = sum(
        (D(d["uncapped"]) - D(d["capped_at"]) for _, _, d in entries
         if d.get("capped_by") == "autobidder_budget"),
        D(0),
    )  # fmt: skip
    assert given_away == D("0.002")  # 20% of the budget: two requests, each 60% of it
    now = timezone.now()
    window = window_for(period="day", now=now).start
    assert autobid_uncollected(tenant_id=tenant.pk, start=window, end=now) == given_away
    # Nothing is in flight any more; a spent budget bids nothing.
    assert autobid_in_flight(tenant_id=tenant.pk) == 0
    assert autobid(tenant=tenant, request_class="interactive").bid == 0
    assert counters_mismatches(tenant) == []
