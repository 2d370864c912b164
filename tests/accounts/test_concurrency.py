"""Real concurrency on PostgreSQL: threads, each with its own database connection, no mocks.

pytest-django's ``transaction=True`` commits the test data, so every thread's connection sees
it (and the tables are flushed afterwards).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal

import pytest

from accounts.ledger import Outcome, Settled
from accounts.models import ChargeKind, Hold, HoldState, LedgerEntry, Period
from accounts.selectors import budget_status, budget_statuses_for_tenant
from accounts.services import (
    BudgetExhausted,
    api_key_create,
    budget_hold,
    budget_set,
    request_fail,
    request_open,
    request_settle,
)
from tests.accounts.factories import (
    MIDNIGHT,
    NOW,
    counters_mismatches,
    market_create,
    priority_charge,
    run_concurrently,
    spend,
    tenant_create,
)
from tests.accounts.reference_ledger import reference_ledger_use

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_200_concurrent_holds_at_a_budgets_edge_never_overspend_it() -> None:
    market = market_create()
    tenant = tenant_create("acme")
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    spend(tenant=tenant, market=market, request_id="earlier", charge=0.3, at=NOW)
    # 1 - 0.3 = 0.7 left; each request holds 0.007: exactly floor(0.7 / 0.007) = 100 fit.
    amount = Decimal("0.007")

    def place(i: int) -> Callable[[], object]:
        return lambda: budget_hold(
            tenant=tenant, api_key=None, request_id=f"c{i}", amount=amount, now=NOW
        )

    results = run_concurrently([place(i) for i in range(200)])
    held = [r for r in results if isinstance(r, Hold)]
    refused = [r for r in results if isinstance(r, BudgetExhausted)]
    assert len(held) == 100
    assert len(refused) == 100
    assert len(held) + len(refused) == 200, [r for r in results if isinstance(r, Exception)]
    status = budget_status(tenant=tenant, now=NOW)
    assert (status.spent, status.held, status.remaining) == (Decimal("0.3"), Decimal("0.7"), 0)
    assert Hold.objects.filter(state=HoldState.OPEN).count() == 100
    assert counters_mismatches(tenant) == []


def test_concurrent_holds_through_a_key_budget_and_the_tenant_budget() -> None:
    market = market_create()
    tenant = tenant_create("acme")
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None, budget_limit="0.35")
    # The key may hold 0.35 / 0.01 = 35 of its 100; the other 100 keyless requests share what
    # the tenant has left: 1 - 0.35 = 0.65, so 65. In all 100 of 200 fit.
    amount = Decimal("0.01")

    def place(i: int) -> Callable[[], object]:
        return lambda: request_open(
            request_id=f"c{i}",
            tenant=tenant,
            api_key=key if i % 2 else None,
            market=market,
            bid="0.1",
            hold_amount=amount,
            now=NOW,
        )

    results = run_concurrently([place(i) for i in range(200)])
    refused = [r for r in results if isinstance(r, BudgetExhausted)]
    others = [r for r in results if isinstance(r, Exception) and not isinstance(r, BudgetExhausted)]
    assert others == []
    by_key = Hold.objects.filter(api_key=key).count()
    assert by_key <= 35
    assert Hold.objects.count() == 100
    assert len(refused) == 100
    assert budget_status(tenant=tenant, now=NOW).held == Decimal("1")
    assert counters_mismatches(tenant) == []


def test_the_same_round_settled_by_many_workers_charges_each_request_once() -> None:
    market = market_create()
    tenant = tenant_create("acme")
    budget_set(tenant=tenant, limit="100", period=Period.DAY)
    rids = [f"r{i}" for i in range(20)]
    for rid in rids:
        request_open(
            request_id=rid,
            tenant=tenant,
            api_key=None,
            market=market,
            bid="1",
            hold_amount="1",
            priority_cap=Decimal("1"),
            now=NOW,
        )
    served = rids[:10]  # settled 8 times each at once (no tokens); the other ten in flight

    def settled(rid: str):
        return request_settle(request_id=rid, prompt_tokens=0, cached_tokens=0, completion_tokens=0,
                              priority=priority_charge(0.25), now=NOW)  # fmt: skip

    results = run_concurrently([lambda r=r: settled(r) for r in served for _ in range(8)])
    assert not [r for r in results if isinstance(r, Exception)]
    assert sum(r.outcome == Outcome.WRITTEN for r in results) == 10
    assert sum(r.outcome == Outcome.DUPLICATE for r in results) == 80 - 10
    assert LedgerEntry.objects.filter(kind=ChargeKind.PRIORITY).count() == 10
    # The served ten: charged 0.25 once each, holds closed; the ten in flight still hold 1 each.
    status = budget_status(tenant=tenant, now=NOW)
    assert (status.spent, status.held) == (Decimal("2.5"), Decimal("10"))
    assert counters_mismatches(tenant) == []


@pytest.mark.parametrize("statements", ["single", "reference"])
def test_holds_charges_and_failures_of_one_tenant_at_once_agree_with_the_ledger(
    statements, monkeypatch
) -> None:
    # Every step of a request's life, for the tenant and for its key, from 40 connections at
    # once: no deadlock, no error but refusals, never over the budget, and the counters are the
    # ledger's and the holds' sums at the end. With the single statements of the hot path, and
    # with the reference ORM code they stand for.
    if statements == "reference":
        reference_ledger_use(monkeypatch)
    market = market_create()
    tenant = tenant_create("acme")
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None, budget_limit="0.5")

    def life(i: int) -> Callable[[], object]:
        rid = f"c{i}"

        def run() -> object:
            request_open(request_id=rid, tenant=tenant, api_key=key if i % 2 else None,
                         market=market, bid="0.1", hold_amount="0.02", now=NOW)  # fmt: skip
            if i % 3 == 0:
                return request_fail(request_id=rid, now=NOW)
            # 100 prompt tokens at $3/M = 0.0003, and a priority charge of 0.01.
            return request_settle(
                request_id=rid, prompt_tokens=100, cached_tokens=0, completion_tokens=0,
                priority=priority_charge(0.01, round_id=f"r{i}"), now=NOW,
            )  # fmt: skip

        return run

    results = run_concurrently([life(i) for i in range(200)])
    others = [r for r in results if isinstance(r, Exception) and not isinstance(r, BudgetExhausted)]
    assert others == []
    assert counters_mismatches(tenant) == []
    status = budget_status(tenant=tenant, now=NOW)
    assert status.held == 0
    assert status.spent == sum(LedgerEntry.objects.values_list("amount", flat=True), Decimal(0))
    assert status.spent <= Decimal("1")
    tenant_budget, key_budget = budget_statuses_for_tenant(tenant=tenant, now=NOW)
    assert (tenant_budget.scope, tenant_budget.spent) == ("tenant", status.spent)
    assert key_budget.scope == "key"
    assert key_budget.spent <= Decimal("0.5")


@pytest.mark.parametrize("statements", ["single", "reference"])
def test_holds_whose_clock_is_behind_the_counters_window_never_overspend_their_own_at_once(
    statements, monkeypatch
) -> None:
    # A gateway whose clock lags stamps its requests Wednesday 23:59:59 after Thursday's first
    # charge moved the counters' day to Thursday: each hold is checked against Wednesday's spend,
    # which only the ledger has, while other connections settle and fail theirs at once.
    if statements == "reference":
        reference_ledger_use(monkeypatch)
    market = market_create()
    tenant = tenant_create("acme")
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    wednesday, thursday = MIDNIGHT - timedelta(seconds=1), MIDNIGHT + timedelta(seconds=1)
    spend(tenant=tenant, market=market, request_id="wed", charge=0.5, at=wednesday)
    spend(tenant=tenant, market=market, request_id="thu", charge=0.25, at=thursday)

    def life(i: int) -> Callable[[], object]:
        rid = f"c{i}"

        def run() -> object:
            request_open(request_id=rid, tenant=tenant, api_key=None, market=market,
                         bid="0.1", hold_amount="0.02", now=wednesday)  # fmt: skip
            if i % 3 == 0:
                return request_fail(request_id=rid, now=wednesday)
            # 100 prompt tokens at $3/M = 0.0003, and a priority charge of 0.0197: its hold.
            return request_settle(
                request_id=rid, prompt_tokens=100, cached_tokens=0, completion_tokens=0,
                priority=priority_charge(0.0197, round_id=f"r{i}"), now=wednesday,
            )  # fmt: skip

        return run

    results = run_concurrently([life(i) for i in range(200)])
    others = [r for r in results if isinstance(r, Exception) and not isinstance(r, BudgetExhausted)]
    assert others == []
    served = [r for r in results if isinstance(r, Settled)]
    # Wednesday had 1 - 0.5 = 0.5 left: at most 25 requests of 0.02 each are served in it, so
    # at least 133 - 25 = 108 of the 133 that would be were refused.
    assert 0 < len(served) <= 25
    assert sum(isinstance(r, BudgetExhausted) for r in results) >= 108
    assert counters_mismatches(tenant) == []
    status = budget_status(tenant=tenant, now=wednesday)
    assert (status.spent, status.held) == (Decimal("0.5") + Decimal("0.02") * len(served), 0)
    # Thursday's window keeps its own charge only.
    assert budget_status(tenant=tenant, now=thursday).spent == Decimal("0.25")
