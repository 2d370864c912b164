"""Settlement: round records -> priority charges, completion reports -> token charges.

Replays change nothing, unknown requests are skipped, a request that was not served is never
charged, and the ledger sums exactly (no float anywhere) to the invoice total.
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from accounts.models import ChargeKind, Hold, HoldState, LedgerEntry, Request, RequestStatus
from accounts.services import (
    SettleResult,
    UnknownRequest,
    invoice_generate,
    month_bounds,
    request_complete,
    request_fail,
    request_open,
    round_record_settle,
    token_charge,
)
from tests.accounts.factories import NOW, admitted, market_create, round_record

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


def served(rid, *, now=NOW) -> LedgerEntry:
    """Complete ``rid`` with no tokens (a token entry of 0): it is served."""
    return request_complete(
        request_id=rid, prompt_tokens=0, cached_tokens=0, completion_tokens=0, now=now
    )


def test_a_round_record_charges_each_admitted_request_its_priority_charge(tenant, market) -> None:
    open_(tenant, market, "r1")
    open_(tenant, market, "r2")
    served("r1")
    served("r2")
    record = round_record("sim:1:7", [admitted("r1", 0.25), admitted("r2", 0.1 + 0.2, position=1)])
    result = round_record_settle(record=record, now=NOW)
    assert result == SettleResult(charged=2, duplicates=0, unknown=0, not_served=0)
    # 0.1 + 0.2 is 0.30000000000000004 as a float: the rule rounds it to 0.300000000.
    assert amounts(ChargeKind.PRIORITY) == {"r1": D("0.25"), "r2": D("0.3")}
    entry = LedgerEntry.objects.get(request_id="r1", kind=ChargeKind.PRIORITY)
    assert (entry.round_id, entry.tenant, entry.market, entry.created_at) == (
        "sim:1:7",
        tenant,
        market,
        NOW,
    )
    assert entry.detail["time_saved_s"] == 0.125 and entry.detail["bid"] == 0.5
    assert Request.objects.get(pk="r1").admitted_at == NOW


def test_replaying_a_round_record_changes_nothing(tenant, market) -> None:
    open_(tenant, market, "r1", hold="0.5")
    record = round_record("sim:1:7", [admitted("r1", 0.25)])
    assert round_record_settle(record=record, now=NOW).pending == 1
    # Replayed while the request is in flight: the pending charge is kept, once.
    replay = round_record_settle(record=record, now=NOW + timedelta(minutes=1))
    assert replay == SettleResult(charged=0, duplicates=1, unknown=0, not_served=0, pending=0)
    served("r1")
    before = list(
        LedgerEntry.objects.values_list("id", "request_id", "kind", "amount", "created_at")
    )
    assert amounts(ChargeKind.PRIORITY) == {"r1": D("0.25")}
    replay = round_record_settle(record=record, now=NOW + timedelta(minutes=5))
    assert replay == SettleResult(charged=0, duplicates=1, unknown=0, not_served=0)
    assert (
        list(LedgerEntry.objects.values_list("id", "request_id", "kind", "amount", "created_at"))
        == before
    )
    hold = Hold.objects.get(request_id="r1")
    assert (hold.state, hold.remaining) == (HoldState.SETTLED, D(0))


def test_a_request_pays_once_even_if_a_later_round_lists_it_again(tenant, market) -> None:
    open_(tenant, market, "r1")
    round_record_settle(record=round_record("sim:1:7", [admitted("r1", 0.25)]), now=NOW)
    result = round_record_settle(
        record=round_record("sim:1:8", [admitted("r1", 0.5)], seq=2), now=NOW
    )
    assert result.duplicates == 1
    served("r1")
    result = round_record_settle(
        record=round_record("sim:1:9", [admitted("r1", 0.75)], seq=3), now=NOW
    )
    assert result.duplicates == 1
    assert amounts(ChargeKind.PRIORITY) == {"r1": D("0.25")}


def test_unknown_requests_are_counted_and_skipped(tenant, market) -> None:
    other_market = market_create("other-llm")
    open_(tenant, market, "r1")
    open_(tenant, other_market, "elsewhere")
    served("r1")
    served("elsewhere")
    record = round_record(
        "sim:1:7", [admitted("ghost", 1.0), admitted("r1", 0.25), admitted("elsewhere", 2.0)]
    )
    result = round_record_settle(record=record, now=NOW)
    assert result == SettleResult(charged=1, duplicates=0, unknown=2, not_served=0)
    assert amounts(ChargeKind.PRIORITY) == {"r1": D("0.25")}


def test_a_malformed_record_is_refused_and_writes_nothing(tenant, market) -> None:
    open_(tenant, market, "r1")
    bad = round_record("sim:1:7", [admitted("r1", 0.25)])
    bad["admitted"][0]["charge"] = -1.0
    with pytest.raises(ValueError, match="negative"):
        round_record_settle(record=bad, now=NOW)
    missing = round_record("sim:1:7", [admitted("r1", 0.25)])
    del missing["admitted"][0]["charge"]
    with pytest.raises(ValueError, match="charge"):
        round_record_settle(record=missing, now=NOW)
    assert not LedgerEntry.objects.exists()


def test_requests_never_admitted_or_never_completed_are_never_charged(tenant, market) -> None:
    open_(tenant, market, "waiting")  # never admitted, never completed
    open_(tenant, market, "admitted-only")
    result = round_record_settle(
        record=round_record("sim:1:7", [admitted("admitted-only", 0.25)]), now=NOW
    )
    assert result == SettleResult(pending=1)
    assert not LedgerEntry.objects.exists()
    # Admitted but still in flight: its priority charge waits on its row, its hold stays whole.
    request = Request.objects.get(pk="admitted-only")
    assert (request.admitted_at, request.priority_pending["amount"]) == (NOW, "0.250000000")
    assert Hold.objects.get(request_id="admitted-only").remaining == D(1)
    # Served: both parts, the priority charge from the round that admitted it.
    served("admitted-only", now=NOW + timedelta(seconds=3))
    entries = LedgerEntry.objects.filter(request_id="admitted-only")
    assert sorted(entries.values_list("kind", "amount", "round_id")) == [
        (ChargeKind.PRIORITY, D("0.25"), "sim:1:7"),
        (ChargeKind.TOKENS, D(0), ""),
    ]
    assert Request.objects.get(pk="admitted-only").priority_pending is None


def test_a_request_admitted_then_failed_is_never_charged(tenant, market) -> None:
    """The engine admitted it, then died; the gateway answered 503 "not charged": so it is."""
    open_(tenant, market, "r1", hold="0.5")
    round_record_settle(record=round_record("sim:1:7", [admitted("r1", 0.25)]), now=NOW)
    assert request_fail(request_id="r1", now=NOW) is True
    assert not LedgerEntry.objects.exists()
    hold = Hold.objects.get(request_id="r1")
    assert (hold.state, hold.remaining) == (HoldState.RELEASED, D(0))
    # The same record redelivered, or a later one, still charges nothing.
    result = round_record_settle(record=round_record("sim:1:7", [admitted("r1", 0.25)]), now=NOW)
    assert result == SettleResult(not_served=1)
    assert not LedgerEntry.objects.exists()


def test_a_failed_request_is_never_charged(tenant, market) -> None:
    open_(tenant, market, "r1", hold="0.5")
    assert request_fail(request_id="r1", now=NOW) is True
    assert Hold.objects.get(request_id="r1").state == HoldState.RELEASED
    # A round record admitting it afterwards, and a completion report, charge nothing.
    result = round_record_settle(record=round_record("sim:1:7", [admitted("r1", 0.25)]), now=NOW)
    assert result == SettleResult(charged=0, duplicates=0, unknown=0, not_served=1)
    with pytest.raises(ValueError, match="not charged"):
        request_complete(
            request_id="r1", prompt_tokens=10, cached_tokens=0, completion_tokens=10, now=NOW
        )
    assert not LedgerEntry.objects.exists()
    assert Request.objects.get(pk="r1").status == RequestStatus.FAILED


def test_completion_of_an_unknown_request(tenant) -> None:
    with pytest.raises(UnknownRequest):
        request_complete(request_id="ghost", prompt_tokens=1, cached_tokens=0, completion_tokens=1)


def test_the_token_charge_uses_the_posted_prices(tenant, market) -> None:
    open_(tenant, market, "r1")
    entry = request_complete(
        request_id="r1", prompt_tokens=1200, cached_tokens=1000, completion_tokens=500, now=NOW
    )
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
    again = request_complete(request_id="r1", prompt_tokens=5, cached_tokens=0, completion_tokens=5)
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
    charge = token_charge(market=market, prompt_tokens=4, cached_tokens=1, completion_tokens=1)
    assert charge == D("0.000005704")
    # 100000 cached at 0.000000007/M = 0.0000000007: rounds up to one nano-dollar; 71428 of
    # them = 0.000000000499996, under half a nano-dollar: 0.
    market.price_input_per_mtok = market.price_output_per_mtok = D(0)
    assert token_charge(
        market=market, prompt_tokens=100000, cached_tokens=100000, completion_tokens=0
    ) == D("0.000000001")
    assert token_charge(
        market=market, prompt_tokens=71428, cached_tokens=71428, completion_tokens=0
    ) == D(0)
    # Rounded once, on the sum: two parts of 0.4 nano-dollars each (100000 tokens at
    # 0.000000004/M) make 0.8, one nano-dollar; rounding each part first would give 0.
    market.price_cached_input_per_mtok = market.price_output_per_mtok = D("0.000000004")
    assert token_charge(
        market=market, prompt_tokens=100000, cached_tokens=100000, completion_tokens=100000
    ) == D("0.000000001")


@pytest.mark.parametrize(
    ("prompt", "cached", "completion"),
    [(-1, 0, 0), (1, 2, 0), (1, 0, -5), (1.0, 0, 0), (True, 0, 0)],
)
def test_bad_token_counts_are_refused(market, prompt, cached, completion) -> None:
    with pytest.raises(ValueError):
        token_charge(
            market=market, prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion
        )


def test_the_ledger_sums_exactly_to_the_invoice_total(tenant, market) -> None:
    start, end = month_bounds(year=2026, month=11)
    # Ten requests, each 0.1 (a float: 0.1000000000000000055...) for priority and tokens of
    # 200 uncached, 1000 cached, 500 out = 0.0084. Floats would sum 0.1 ten times to
    # 0.9999999999999999; the ledger must give exactly 10 x 0.1084 = 1.084.
    for i in range(10):
        rid = f"r{i}"
        at = datetime(2026, 11, 3, tzinfo=UTC) + timedelta(hours=i)
        open_(tenant, market, rid, now=at)
        # Half of them complete before their round record is settled, half after.
        record = round_record(f"sim:1:{i}", [admitted(rid, 0.1)], seq=i)
        if i % 2:
            round_record_settle(record=record, now=at)
        request_complete(
            request_id=rid, prompt_tokens=1200, cached_tokens=1000, completion_tokens=500, now=at
        )
        if not i % 2:
            round_record_settle(record=record, now=at)
    invoice = invoice_generate(
        tenant=tenant, period_start=start, period_end=end, now=NOW + timedelta(days=30)
    )
    ledger_sum = sum(LedgerEntry.objects.values_list("amount", flat=True), D(0))
    assert all(isinstance(a, Decimal) for a in LedgerEntry.objects.values_list("amount", flat=True))
    assert ledger_sum == invoice.total == D("1.084")
    assert (invoice.priority_total, invoice.tokens_total) == (D("1"), D("0.084"))
    assert sum((line.total for line in invoice.lines.all()), D(0)) == invoice.total


def test_a_priority_charge_never_goes_past_the_requests_cap(tenant, market) -> None:
    """The gateway holds bid x max_wait_s as the priority part; a plan whose wait outgrew it
    (the engine reports more) is charged the cap, and the budget is never exceeded."""
    from accounts.models import Period
    from accounts.selectors.budgets import budget_usage
    from accounts.services import budget_set

    budget = budget_set(tenant=tenant, limit="1.5", period=Period.DAY)
    # Hold 1.0 = tokens 0.4 + priority cap 0.6 (e.g. bid 0.01 $/s x 60 s).
    open_(tenant, market, "r1", hold="1.0", bid="0.01", priority_cap=D("0.6"))
    open_(tenant, market, "r2", hold="0.5")  # no cap: charged as the engine says
    served("r1")
    served("r2")
    record = round_record("sim:1:7", [admitted("r1", 0.9), admitted("r2", 0.45, position=1)])
    assert round_record_settle(record=record, now=NOW).charged == 2
    assert amounts(ChargeKind.PRIORITY) == {"r1": D("0.6"), "r2": D("0.45")}
    detail = LedgerEntry.objects.get(request_id="r1", kind=ChargeKind.PRIORITY).detail
    assert detail["engine_charge"] == 0.9 and detail["capped_at"] == "0.600000000"
    assert (detail["capped_by"], detail["uncapped"]) == ("priority_cap", "0.900000000")
    r2 = LedgerEntry.objects.get(request_id="r2", kind=ChargeKind.PRIORITY)
    assert "capped_at" not in r2.detail
    # r1's token charge (0) kept only its cap, 0.6, reserved, and its priority charge took it;
    # r2 had no cap recorded, so its hold closed with its tokens and its 0.45 came out of the
    # budget's room (1.5 - 0.6 spent - 0 held = 0.9). Spent 1.05, nothing held.
    usage = budget_usage(budget=budget, now=NOW)
    assert (usage.spent, usage.held) == (D("1.05"), D(0))


@pytest.mark.parametrize("cap", ["-0.01", "1.01"])
def test_a_priority_cap_outside_the_hold_is_refused(tenant, market, cap) -> None:
    with pytest.raises(ValueError, match="priority_cap"):
        open_(tenant, market, "r1", hold="1.0", bid="0.01", priority_cap=D(cap))
    assert not Request.objects.exists() and not Hold.objects.exists()


def test_the_sweep_closes_what_a_lost_step_left_open(tenant, market) -> None:
    from accounts.models import Period
    from accounts.selectors import budget_status
    from accounts.services import budget_set, holds_sweep

    budget_set(tenant=tenant, limit="10", period=Period.DAY)
    # lost: served, its round record never came; its hold keeps the 0.6 cap.
    open_(tenant, market, "lost", hold="1", priority_cap=D("0.6"))
    served("lost")
    # crashed: served, with a priority charge still pending (as after a process stopped
    # between its token charge and that write).
    open_(tenant, market, "crashed", hold="1", priority_cap=D("0.6"))
    served("crashed")
    Request.objects.filter(pk="crashed").update(
        priority_pending={"amount": "0.25", "round_id": "sim:1:3", "detail": {"bid": 0.5}}
    )
    # stale: queued for over an hour (its gateway is gone); young: queued just now.
    open_(tenant, market, "stale", hold="1", now=NOW - timedelta(hours=2))
    open_(tenant, market, "young", hold="1", now=NOW)
    assert budget_status(tenant=tenant, now=NOW).held == D("3.2")  # 0.6 + 0.6 + 1 + 1

    early = holds_sweep(settle_grace_s=600, stale_after_s=3600, now=NOW + timedelta(seconds=60))
    # The pending charge is written at once; nothing is old enough to release or fail yet
    # but stale (2 h).
    assert (early.pending_written, early.holds_released, early.failed) == (1, 0, 1)
    assert amounts(ChargeKind.PRIORITY) == {"crashed": D("0.25")}
    assert Request.objects.get(pk="stale").status == RequestStatus.FAILED
    assert Hold.objects.get(request_id="lost").state == HoldState.OPEN

    later = holds_sweep(settle_grace_s=600, stale_after_s=3600, now=NOW + timedelta(minutes=11))
    assert (later.pending_written, later.holds_released, later.failed) == (0, 1, 0)
    assert Hold.objects.get(request_id="lost").state == HoldState.RELEASED
    assert Request.objects.get(pk="young").status == RequestStatus.QUEUED
    assert budget_status(tenant=tenant, now=NOW).held == D("1")  # young's
    # The lost record turns up after all: charged (the budget has room), once.
    round_record_settle(record=round_record("sim:1:9", [admitted("lost", 0.5)]), now=NOW)
    assert amounts(ChargeKind.PRIORITY) == {"crashed": D("0.25"), "lost": D("0.5")}
    again = holds_sweep(settle_grace_s=600, stale_after_s=3600, now=NOW + timedelta(minutes=12))
    assert again == type(again)()
