"""Settlement: a served request's answer -> its token charge and its priority charge, at once.

Replays change nothing, unknown requests are refused, a request that was not served is never
charged, and the ledger sums exactly (no float anywhere) to the invoice total.
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection

from accounts.ledger import Outcome, Usage
from accounts.models import ChargeKind, Hold, HoldState, LedgerEntry, Request, RequestStatus
from accounts.services import (
    UnknownRequest,
    invoice_generate,
    month_bounds,
    request_fail,
    request_open,
    request_settle,
    token_charge,
)
from tests.accounts.factories import NOW, market_create, priority_charge

pytestmark = pytest.mark.django_db

D = Decimal


def open_(tenant, market, rid, *, hold="1", bid="0.5", priority_cap=None, now=NOW) -> Request:
    return request_open(
        request_id=rid,
        tenant=tenant,
        api_key=None,
        market=market,
        bid=bid,
        hold_amount=hold,
        priority_cap=priority_cap,
        now=now,
    )


def amounts(kind: str) -> dict[str, Decimal]:
    return dict(LedgerEntry.objects.filter(kind=kind).values_list("request_id", "amount"))


def test_settling_writes_both_charges_at_once_and_closes_the_hold(tenant, market) -> None:
    open_(tenant, market, "r1")
    settled = request_settle(
        request_id="r1", prompt_tokens=1200, cached_tokens=1000, completion_tokens=500,
        priority=priority_charge(0.1 + 0.2, round_id="sim:1:7"), now=NOW,
    )  # fmt: skip
    assert settled.outcome == Outcome.WRITTEN
    # 0.1 + 0.2 is 0.30000000000000004 as a float: the rule rounds it to 0.300000000. Tokens:
    # 200 uncached x $3/M + 1000 cached x $0.30/M + 500 out x $15/M = 0.0084.
    assert amounts(ChargeKind.PRIORITY) == {"r1": D("0.3")}
    assert amounts(ChargeKind.TOKENS) == {"r1": D("0.0084")}
    assert (settled.priority.amount, settled.tokens.amount) == (D("0.3"), D("0.0084"))
    entry = LedgerEntry.objects.get(request_id="r1", kind=ChargeKind.PRIORITY)
    assert (entry.round_id, entry.tenant, entry.market, entry.created_at) == (
        "sim:1:7",
        tenant,
        market,
        NOW,
    )
    assert entry.detail["time_saved_s"] == 0.125 and entry.detail["bid"] == 0.5
    assert entry.detail["engine"] == "sim"
    hold = Hold.objects.get(request_id="r1")
    assert (hold.state, hold.remaining, hold.closed_at) == (HoldState.SETTLED, D(0), NOW)
    request = Request.objects.get(pk="r1")
    assert (request.status, request.finished_at) == (RequestStatus.SERVED, NOW)


def test_a_request_settles_once(tenant, market) -> None:
    open_(tenant, market, "r1", hold="0.5")
    first = request_settle(
        request_id="r1", prompt_tokens=0, cached_tokens=0, completion_tokens=0,
        priority=priority_charge(0.25), now=NOW,
    )  # fmt: skip
    before = list(
        LedgerEntry.objects.values_list("id", "request_id", "kind", "amount", "created_at")
    )
    # Replayed, later, with other figures (a later round's charge, more tokens): nothing changes,
    # and the replay says what the first settlement wrote.
    again = request_settle(
        request_id="r1", prompt_tokens=10, cached_tokens=0, completion_tokens=10,
        priority=priority_charge(0.75, round_id="sim:1:9"), now=NOW + timedelta(minutes=5),
    )  # fmt: skip
    assert again.outcome == Outcome.DUPLICATE
    assert (again.priority.pk, again.tokens.pk) == (first.priority.pk, first.tokens.pk)
    after = list(
        LedgerEntry.objects.values_list("id", "request_id", "kind", "amount", "created_at")
    )
    assert after == before
    assert amounts(ChargeKind.PRIORITY) == {"r1": D("0.25")}


def test_a_request_never_settled_is_never_charged(tenant, market) -> None:
    open_(tenant, market, "waiting")
    assert not LedgerEntry.objects.exists()
    assert Hold.objects.get(request_id="waiting").remaining == D(1)


def test_a_failed_request_is_never_charged(tenant, market) -> None:
    """The engine admitted it, then died; the gateway answered 503 "not charged": so it is."""
    open_(tenant, market, "r1", hold="0.5")
    assert request_fail(request_id="r1", now=NOW) is True
    assert Hold.objects.get(request_id="r1").state == HoldState.RELEASED
    # A settlement afterwards (a late answer) charges nothing.
    with pytest.raises(ValueError, match="not charged"):
        request_settle(
            request_id="r1", prompt_tokens=10, cached_tokens=0, completion_tokens=10,
            priority=priority_charge(0.25), now=NOW,
        )  # fmt: skip
    assert not LedgerEntry.objects.exists()
    assert Request.objects.get(pk="r1").status == RequestStatus.FAILED
    hold = Hold.objects.get(request_id="r1")
    assert (hold.state, hold.remaining) == (HoldState.RELEASED, D(0))


def test_completion_of_an_unknown_request(tenant) -> None:
    with pytest.raises(UnknownRequest):
        request_settle(request_id="ghost", prompt_tokens=1, cached_tokens=0, completion_tokens=1)


def test_the_token_charge_uses_the_posted_prices(tenant, market) -> None:
    open_(tenant, market, "r1")
    entry = request_settle(
        request_id="r1", prompt_tokens=1200, cached_tokens=1000, completion_tokens=500, now=NOW
    ).tokens
    # 200 uncached x $3/M = 0.0006; 1000 cached x $0.30/M = 0.0003; 500 out x $15/M = 0.0075.
    assert entry.amount == D("0.0084")
    assert entry.kind == ChargeKind.TOKENS
    assert entry.detail == {"prompt_tokens": 1200, "cached_tokens": 1000, "completion_tokens": 500}
    request = Request.objects.get(pk="r1")
    assert (request.status, request.finished_at, request.completion_tokens) == (
        RequestStatus.SERVED,
        NOW,
        500,
    )
    # Replayed: the first entry, unchanged, even with other numbers.
    again = request_settle(
        request_id="r1", prompt_tokens=5, cached_tokens=0, completion_tokens=5
    ).tokens
    assert (again.pk, again.amount) == (entry.pk, D("0.0084"))
    assert LedgerEntry.objects.count() == 1


def test_the_token_charge_is_rounded_once() -> None:
    market = market_create("odd")
    market.price_input_per_mtok = D("1.234567891")
    market.price_cached_input_per_mtok = D("0.000000007")
    market.price_output_per_mtok = D("2.000000001")
    # input: 3 x 1.234567891 / 10**6 = 0.000003703703673
    # cached: 1 x 0.000000007 / 10**6 = 0.000000000000007
    # output: 1 x 2.000000001 / 10**6 = 0.000002000000001
    # sum = 0.000005703703681; its 10th decimal is 6, so it rounds up to 0.000005704.
    charge = token_charge(market=market, usage=Usage(4, 1, 1))
    assert charge == D("0.000005704")
    # 100000 cached at 0.000000007/M = 0.0000000007: rounds up to one nano-dollar; 71428 of
    # them = 0.000000000499996, under half a nano-dollar: 0.
    market.price_input_per_mtok = market.price_output_per_mtok = D(0)
    assert token_charge(market=market, usage=Usage(100000, 100000, 0)) == D("0.000000001")
    assert token_charge(market=market, usage=Usage(71428, 71428, 0)) == D(0)
    # Rounded once, on the sum: two parts of 0.4 nano-dollars each (100000 tokens at
    # 0.000000004/M) make 0.8, one nano-dollar; rounding each part first would give 0.
    market.price_cached_input_per_mtok = market.price_output_per_mtok = D("0.000000004")
    assert token_charge(market=market, usage=Usage(100000, 100000, 100000)) == D("0.000000001")


@pytest.mark.parametrize(
    ("prompt", "cached", "completion"),
    [(-1, 0, 0), (1, 2, 0), (1, 0, -5), (1.0, 0, 0), (True, 0, 0)],
)
def test_bad_token_counts_are_refused(market, prompt, cached, completion) -> None:
    with pytest.raises(ValueError):
        token_charge(market=market, usage=Usage(prompt, cached, completion))


def test_the_ledger_sums_exactly_to_the_invoice_total(tenant, market) -> None:
    start, end = month_bounds(year=2026, month=11)
    # Ten requests, each 0.1 (a float: 0.1000000000000000055...) for priority and tokens of
    # 200 uncached, 1000 cached, 500 out = 0.0084. Floats would sum 0.1 ten times to
    # 0.9999999999999999; the ledger must give exactly 10 x 0.1084 = 1.084.
    for i in range(10):
        rid = f"r{i}"
        at = datetime(2026, 11, 3, tzinfo=UTC) + timedelta(hours=i)
        open_(tenant, market, rid, now=at)
        request_settle(
            request_id=rid, prompt_tokens=1200, cached_tokens=1000, completion_tokens=500,
            priority=priority_charge(0.1, round_id=f"sim:1:{i}"), now=at,
        )  # fmt: skip
    invoice = invoice_generate(
        tenant=tenant, period_start=start, period_end=end, now=NOW + timedelta(days=30)
    )
    ledger_sum = sum(LedgerEntry.objects.values_list("amount", flat=True), D(0))
    assert all(isinstance(a, Decimal) for a in LedgerEntry.objects.values_list("amount", flat=True))
    assert ledger_sum == invoice.total == D("1.084")
    assert (invoice.priority_total, invoice.tokens_total) == (D("1"), D("0.084"))
    assert sum((line.total for line in invoice.lines.all()), D(0)) == invoice.total


def test_a_priority_charge_never_goes_past_the_requests_cap(tenant, market) -> None:
    """The priority cap is what the tenant consented to (e.g. bid 0.01 $/s x 60 s); an engine
    that reports more is charged the cap, and the budget is never exceeded."""
    from accounts.models import Period
    from accounts.selectors.budgets import budget_usage
    from accounts.services import budget_set

    budget = budget_set(tenant=tenant, limit="1.5", period=Period.DAY)
    open_(tenant, market, "r1", hold="1.0", bid="0.01", priority_cap=D("0.6"))
    open_(tenant, market, "r2", hold="0.5")  # no cap: charged as the engine says
    # r1: held 1.5 in all, nothing spent: its room is its hold, 1.0; its 0.9 is cut to 0.6.
    request_settle(request_id="r1", prompt_tokens=0, cached_tokens=0, completion_tokens=0,
                   priority=priority_charge(0.9), now=NOW)  # fmt: skip
    # r2: spent 0.6, held 0.5 (its own): room 0.5 + (1.5 - 0.6 - 0.5) = 0.9; 0.45 fits.
    request_settle(request_id="r2", prompt_tokens=0, cached_tokens=0, completion_tokens=0,
                   priority=priority_charge(0.45), now=NOW)  # fmt: skip
    assert amounts(ChargeKind.PRIORITY) == {"r1": D("0.6"), "r2": D("0.45")}
    detail = LedgerEntry.objects.get(request_id="r1", kind=ChargeKind.PRIORITY).detail
    assert detail["engine_charge"] == 0.9 and detail["capped_at"] == "0.600000000"
    assert (detail["capped_by"], detail["uncapped"]) == ("priority_cap", "0.900000000")
    r2 = LedgerEntry.objects.get(request_id="r2", kind=ChargeKind.PRIORITY)
    assert "capped_at" not in r2.detail
    usage = budget_usage(budget=budget, now=NOW)
    assert (usage.spent, usage.held) == (D("1.05"), D(0))


def test_a_negative_priority_cap_is_refused_and_one_above_the_hold_is_kept(tenant, market) -> None:
    with pytest.raises(ValueError, match="priority_cap"):
        open_(tenant, market, "r1", hold="1.0", bid="0.01", priority_cap=D("-0.01"))
    assert not Request.objects.exists() and not Hold.objects.exists()
    # The consent cap may exceed the hold: the hold is what the request is likely to cost.
    request = open_(tenant, market, "r2", hold="0.1", bid="0.01", priority_cap=D("0.6"))
    assert request.priority_cap == D("0.6")


def test_the_sweep_fails_what_a_lost_gateway_left_queued(tenant, market) -> None:
    from accounts.models import Period
    from accounts.selectors import budget_status
    from accounts.services import budget_set, holds_sweep

    budget_set(tenant=tenant, limit="10", period=Period.DAY)
    # stale: queued for over an hour (its gateway is gone); young: queued just now.
    open_(tenant, market, "stale", hold="1", now=NOW - timedelta(hours=2))
    open_(tenant, market, "young", hold="1", now=NOW)
    assert budget_status(tenant=tenant, now=NOW).held == D("2")
    swept = holds_sweep(stale_after_s=3600, now=NOW + timedelta(seconds=60))
    assert swept.failed == 1
    assert Request.objects.get(pk="stale").status == RequestStatus.FAILED
    assert Request.objects.get(pk="young").status == RequestStatus.QUEUED
    assert budget_status(tenant=tenant, now=NOW).held == D("1")  # young's
    assert holds_sweep(stale_after_s=3600, now=NOW + timedelta(seconds=61)).failed == 0
    assert not LedgerEntry.objects.exists()


def test_the_ledger_statements_are_planned_once(tenant, market) -> None:
    """PostgreSQL plans a prepared statement anew for each execution's parameters for its
    first five executions, and after them while its default (``plan_cache_mode`` auto) judges
    that pays; the ledger's statements are to be planned once per connection (a generic plan)
    and never again. Eight requests opened and settled one at a time: the settle statement runs
    eight times and the hold statement nine (the tenant's first hold declines until its counter
    rows are made, then runs again), every one on the generic plan."""
    for i in range(8):
        open_(tenant, market, f"p{i}", hold="0.01")
        request_settle(
            request_id=f"p{i}", prompt_tokens=10, cached_tokens=0, completion_tokens=5,
            priority=priority_charge(0.001), now=NOW,
        )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%INSERT INTO accounts_hold%%'"
            " OR statement LIKE '%%INSERT INTO accounts_ledgerentry%%'"
        )
        plans = {
            ("hold" if "INSERT INTO accounts_hold" in s else "settle"): (generic, custom)
            for s, generic, custom in cursor.fetchall()
        }
    assert plans == {"hold": (9, 0), "settle": (8, 0)}
