"""Budget counters: the running sums a hold is checked against, kept in step with the ledger.

Each counter value below is worked out by hand from the charges made; ``counters_mismatches``
also re-sums the ledger and the holds independently. On PostgreSQL the writes are single
statements (``accounts.ledger.statements``): they are checked against the ORM reference
(``tests.accounts.reference_ledger``), and the hot path's statement counts are pinned.
"""

import importlib
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.apps import apps

from accounts.ledger import Settled
from accounts.models import BudgetCounter, Hold, LedgerEntry, Period, Request
from accounts.selectors import budget_status
from accounts.services import (
    BudgetExhausted,
    api_key_create,
    budget_hold,
    budget_set,
    hold_release,
    request_fail,
    request_open,
    request_settle,
)
from market.models import Market
from tests.accounts.factories import (
    MIDNIGHT,
    NOW,
    counters_mismatches,
    market_create,
    priority_charge,
    spend,
    tenant_create,
)
from tests.accounts.reference_ledger import reference_ledger_use

pytestmark = pytest.mark.django_db

D = Decimal


def counters(tenant) -> dict:
    """The tenant's counter rows by key id (None: the tenant's own), as plain values."""
    names = ["held", "spent_total", "day_start", "day_spent", "week_start", "week_spent"]
    names += ["month_start", "month_spent"]
    return {
        c.api_key_id: {name: getattr(c, name) for name in names}
        for c in BudgetCounter.objects.filter(tenant=tenant)
    }


def open_(tenant, market, rid, hold, *, key=None, at=NOW):
    return request_open(
        request_id=rid,
        tenant=tenant,
        api_key=key,
        market=market,
        bid="0.5",
        hold_amount=hold,
        now=at,
    )


def test_counters_follow_a_requests_life(tenant, market) -> None:
    budget_set(tenant=tenant, limit="10", period=Period.DAY)
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None, budget_limit="5")
    open_(tenant, market, "r1", "1", key=key)
    open_(tenant, market, "r2", "2")
    assert {k: c["held"] for k, c in counters(tenant).items()} == {None: D(3), key.pk: D(1)}
    # Tokens: 200 uncached x $3/M + 1000 cached x $0.30/M + 500 output x $15/M = 0.0084.
    request_settle(
        request_id="r1", prompt_tokens=1200, cached_tokens=1000, completion_tokens=500,
        priority=priority_charge(0.25), now=NOW,
    )  # fmt: skip
    request_fail(request_id="r2", now=NOW)
    # r1 spent 0.25 + 0.0084; its hold closed and r2's was released: nothing held.
    windows = {
        "day_start": datetime(2026, 11, 18, tzinfo=UTC),
        "week_start": datetime(2026, 11, 16, tzinfo=UTC),
        "month_start": datetime(2026, 11, 1, tzinfo=UTC),
    }
    spent = {"spent_total": D("0.2584"), "day_spent": D("0.2584")}
    spent |= {"week_spent": D("0.2584"), "month_spent": D("0.2584")}
    expected = {"held": D(0), **spent, **windows}
    assert counters(tenant) == {None: expected, key.pk: expected}
    assert counters_mismatches(tenant) == []


def test_a_new_window_starts_at_its_first_charge_and_a_late_charge_stays_in_its_own(
    tenant, market
) -> None:
    budget_set(tenant=tenant, limit="10", period=Period.DAY)
    spend(tenant=tenant, market=market, request_id="wed", charge=0.25, at=NOW)
    spend(tenant=tenant, market=market, request_id="thu", charge=0.5, at=MIDNIGHT)
    # A charge stamped just before midnight, settled after the new day's first one.
    spend(
        tenant=tenant,
        market=market,
        request_id="late",
        charge=0.125,
        at=MIDNIGHT - timedelta(seconds=1),
    )
    row = counters(tenant)[None]
    assert (row["day_start"], row["day_spent"]) == (MIDNIGHT, D("0.5"))
    assert row["week_spent"] == row["month_spent"] == row["spent_total"] == D("0.875")
    assert counters_mismatches(tenant) == []
    # Wednesday, read after Thursday started: summed from the ledger, 0.25 + 0.125.
    before = budget_status(tenant=tenant, now=MIDNIGHT - timedelta(milliseconds=1))
    assert before.spent == D("0.375")
    assert budget_status(tenant=tenant, now=MIDNIGHT + timedelta(hours=1)).spent == D("0.5")
    # Friday has spent nothing yet, without any row having been reset.
    assert budget_status(tenant=tenant, now=MIDNIGHT + timedelta(days=1)).spent == D(0)


def test_a_hold_whose_clock_is_behind_the_counters_window_is_checked_against_its_own(
    tenant, market
) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    spend(
        tenant=tenant,
        market=market,
        request_id="wed",
        charge=0.7,
        at=MIDNIGHT - timedelta(seconds=2),
    )
    spend(
        tenant=tenant,
        market=market,
        request_id="thu",
        charge=0.2,
        at=MIDNIGHT + timedelta(seconds=1),
    )
    # Stamped Wednesday (a gateway whose clock lags): Wednesday's 0.7 counts, not Thursday's 0.2.
    wednesday = MIDNIGHT - timedelta(seconds=1)
    with pytest.raises(BudgetExhausted) as refused:
        budget_hold(tenant=tenant, api_key=None, request_id="h1", amount="0.4", now=wednesday)
    assert refused.value.remaining == D("0.3")
    budget_hold(tenant=tenant, api_key=None, request_id="h2", amount="0.3", now=wednesday)
    # Thursday: 0.2 spent + 0.3 held.
    thursday = MIDNIGHT + timedelta(seconds=2)
    with pytest.raises(BudgetExhausted):
        budget_hold(tenant=tenant, api_key=None, request_id="h3", amount="0.51", now=thursday)
    budget_hold(tenant=tenant, api_key=None, request_id="h4", amount="0.5", now=thursday)
    assert counters_mismatches(tenant) == []


def test_counters_missing_for_existing_spend_are_summed_from_the_ledger(tenant, market) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.MONTH)
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None)
    spend(tenant=tenant, market=market, request_id="a", charge=0.25, at=NOW - timedelta(days=2))
    spend(tenant=tenant, market=market, request_id="b", charge=0.125, at=NOW, api_key=key)
    open_(tenant, market, "in-flight", "0.5", key=key)
    BudgetCounter.objects.all().delete()  # as before the counters existed
    status = budget_status(tenant=tenant, now=NOW)
    assert (status.spent, status.held) == (D("0.375"), D("0.5"))
    with pytest.raises(BudgetExhausted):
        budget_hold(tenant=tenant, api_key=key, request_id="c", amount="0.126", now=NOW)
    budget_hold(tenant=tenant, api_key=key, request_id="d", amount="0.125", now=NOW)
    rows = counters(tenant)
    assert (rows[None]["month_spent"], rows[None]["held"]) == (D("0.375"), D("0.625"))
    assert (rows[key.pk]["month_spent"], rows[key.pk]["held"]) == (D("0.125"), D("0.625"))
    assert rows[None]["day_spent"] == D("0.125")  # the 16th's 0.25 is not today's
    assert counters_mismatches(tenant) == []


def test_a_settlement_and_a_release_first_create_the_counters_they_miss(tenant, market) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None)
    open_(tenant, market, "r1", "0.25", key=key)
    open_(tenant, market, "r2", "0.125")
    budget_hold(tenant=tenant, api_key=None, request_id="h", amount="0.0625", now=NOW)
    BudgetCounter.objects.all().delete()  # as before the counters existed
    # r1: tokens 0.0084 (as in test_counters_follow_a_requests_life) + 0.25 priority = 0.2584.
    request_settle(
        request_id="r1", prompt_tokens=1200, cached_tokens=1000, completion_tokens=500,
        priority=priority_charge(0.25), now=NOW,
    )  # fmt: skip
    rows = counters(tenant)
    assert (rows[None]["day_spent"], rows[None]["held"]) == (D("0.2584"), D("0.1875"))
    assert (rows[key.pk]["day_spent"], rows[key.pk]["held"]) == (D("0.2584"), D(0))
    BudgetCounter.objects.all().delete()
    assert request_fail(request_id="r2", now=NOW)
    rows = counters(tenant)
    assert set(rows) == {None}  # r2 was the tenant's own
    assert (rows[None]["day_spent"], rows[None]["held"]) == (D("0.2584"), D("0.0625"))
    BudgetCounter.objects.all().delete()
    assert hold_release(request_id="h", now=NOW)
    rows = counters(tenant)
    assert (rows[None]["spent_total"], rows[None]["held"]) == (D("0.2584"), D(0))
    assert counters_mismatches(tenant) == []


def test_the_migration_builds_the_counters_of_existing_data(tenant, market) -> None:
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None)
    spend(tenant=tenant, market=market, request_id="a", charge=0.25, at=NOW, api_key=key)
    spend(tenant=tenant, market=market, request_id="b", charge=0.5, at=NOW - timedelta(days=40))
    open_(tenant, market, "in-flight", "0.75")
    BudgetCounter.objects.all().delete()
    migration = importlib.import_module("accounts.migrations.0005_budget_counters")
    migration.counters_build(apps, None)
    rows = counters(tenant)
    assert set(rows) == {None, key.pk}
    assert (rows[None]["spent_total"], rows[None]["held"]) == (D("0.75"), D("0.75"))
    assert (rows[key.pk]["spent_total"], rows[key.pk]["held"]) == (D("0.25"), D(0))
    assert counters_mismatches(tenant) == []


# --- The single statements against the reference code ------------------------------------------


def life(slug: str) -> list:
    """Every kind of write, on a tenant of its own; returns what the services returned."""
    tenant = tenant_create(slug)
    market = market_create(f"m-{slug}")
    budget_set(tenant=tenant, limit="2", period=Period.DAY)
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None, budget_limit="1")
    out = []

    def call(fn, **kwargs):
        try:
            result = fn(**kwargs)
        except (BudgetExhausted, ValueError, LookupError) as exc:
            return out.append((type(exc).__name__, str(exc)))
        if isinstance(result, Hold):
            result = (result.request_id, result.amount, result.remaining, result.state)
        elif isinstance(result, Request):
            result = (result.request_id, result.bid, result.status, result.created_at)
        elif isinstance(result, Settled):
            result = tuple(
                field
                for e in (result.tokens, result.priority)
                if e is not None
                for field in (e.request_id, e.kind, e.amount, e.created_at)
            )
        out.append(result)

    def opened(rid, hold, key=None, at=NOW):
        call(request_open, request_id=f"{slug}-{rid}", tenant=tenant, api_key=key, market=market,
             bid="0.5", hold_amount=hold, now=at)  # fmt: skip

    def completed(rid, charge=None, at=NOW):
        priority = None if charge is None else priority_charge(charge, round_id=f"rd-{rid}")
        call(request_settle, request_id=f"{slug}-{rid}", prompt_tokens=1200, cached_tokens=1000,
             completion_tokens=500, ttft_s=0.5, priority=priority, now=at)  # fmt: skip

    opened("a", "0.6", key)
    opened("b", "0.6", key)  # the key's budget refuses: 0.6 + 0.6 > 1
    opened("a", "0.6", key)  # a replay returns the first
    opened("c", "1.2")
    opened("d", "0.3")  # the tenant's refuses: 0.6 + 1.2 + 0.3 > 2
    completed("a", 0.25)  # the tokens and the priority charge
    completed("a", 0.25)  # replayed
    completed("c", 1.5)  # its priority charge, above its hold, fits the budget: charged in full
    opened("e", "0.1", key)
    call(request_fail, request_id=f"{slug}-e", now=NOW)  # admitted, then failed: never charged
    completed("e", 0.05)
    call(budget_hold, tenant=tenant, api_key=None, request_id=f"{slug}-h", amount="0.01", now=NOW)
    call(hold_release, request_id=f"{slug}-h", now=NOW)
    call(hold_release, request_id=f"{slug}-h", now=NOW)
    opened("f", "0.01", at=MIDNIGHT)  # a new day
    completed("f", 0.005, at=MIDNIGHT)
    opened("g", "0.01", at=MIDNIGHT - timedelta(seconds=1))  # a lagging clock
    completed("g", 0.005, at=MIDNIGHT - timedelta(seconds=1))
    completed("ghost")
    state = {
        "entries": sorted(
            (e.request_id.split("-", 1)[1], e.kind, e.amount, e.created_at, e.round_id, e.detail)
            for e in LedgerEntry.objects.filter(tenant=tenant)
        ),
        "holds": sorted(
            (h.request_id.split("-", 1)[1], h.amount, h.remaining, h.state, h.closed_at)
            for h in Hold.objects.filter(tenant=tenant)
        ),
        "requests": sorted(
            (
                r.request_id.split("-", 1)[1],
                r.status,
                r.finished_at,
                r.prompt_tokens,
                r.cached_tokens,
                r.completion_tokens,
                r.ttft_s,
                r.e2e_s,
            )
            for r in Request.objects.filter(tenant=tenant)
        ),  # fmt: skip
        "counters": {k is not None: c for k, c in counters(tenant).items()},
        "status": {
            name: value
            for name, value in budget_status(tenant=tenant, api_key=key, now=MIDNIGHT)
            .as_json()
            .items()
            if name != "budget_id"
        },
    }
    assert counters_mismatches(tenant) == []
    unslugged = [
        tuple(v.replace(slug, "") if isinstance(v, str) else v for v in r)
        if isinstance(r, tuple)
        else r
        for r in out
    ]
    return [*unslugged, state]


def test_the_single_statements_do_what_the_reference_code_does(monkeypatch) -> None:
    fast = life("fast")
    reference_ledger_use(monkeypatch)
    reference = life("ref")
    assert fast == reference
    # And by hand, so that the two agreeing is not the two making one mistake (or doing nothing):
    # one entry per call, in life's order; b (index 1) is over the key's 1 (0.6 + 0.6) and d
    # (index 4) over the tenant's 2 (0.6 + 1.2 + 0.3).
    refused = [i for i, r in enumerate(fast) if isinstance(r, tuple) and r[0] == "BudgetExhausted"]
    assert refused == [1, 4]
    # Spent: a 0.25 + c 1.5 (in full, above its hold: the budget had room) + f 0.005 + g 0.005,
    # and each of them its tokens, 0.0084 (as in test_counters_follow_a_requests_life):
    # 1.76 + 4 x 0.0084 = 1.7936; e was admitted but failed: nothing. Only a went through the
    # key: 0.2584. Held: nothing, every request settled or released.
    counter_rows = fast[-1]["counters"]
    assert (counter_rows[False]["spent_total"], counter_rows[False]["held"]) == (
        D("1.7936"),
        D(0),
    )
    assert (counter_rows[True]["spent_total"], counter_rows[True]["held"]) == (D("0.2584"), D(0))


def test_the_hot_path_takes_one_statement_per_step(
    tenant, market, django_assert_num_queries
) -> None:
    budget_set(tenant=tenant, limit="10", period=Period.DAY)
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None)
    open_(tenant, market, "first", "0.1", key=key)  # creates the counter rows
    with django_assert_num_queries(1):
        open_(tenant, market, "r1", "0.1", key=key)
    with django_assert_num_queries(2):  # the market's prices, then both charges at once
        request_settle(
            request_id="r1", prompt_tokens=10, cached_tokens=0, completion_tokens=1,
            priority=priority_charge(0.01),
        )  # fmt: skip
    open_(tenant, market, "r3", "0.1", key=key)
    with django_assert_num_queries(1):  # the caller knows the prices: checked as it charges
        request_settle(
            request_id="r3", prompt_tokens=10, cached_tokens=0, completion_tokens=1,
            priority=priority_charge(0.01), market=market,
        )  # fmt: skip
    open_(tenant, market, "r2", "0.1", key=key)
    with django_assert_num_queries(1):
        request_fail(request_id="r2")
    assert counters_mismatches(tenant) == []


def test_named_parameters_become_postgresqls_numbered_ones_once_each() -> None:
    """The statements' cursor sends PostgreSQL's own placeholders (no parse by psycopg): a name
    used twice keeps its number; numbers follow the order of first use."""
    from accounts.ledger.statements.sql import numbered

    raw, names = numbered(
        "SELECT %(b)s::numeric, %(a)s::bigint WHERE x = %(b)s::numeric AND y = %(c)s"
    )
    assert raw == "SELECT $1::numeric, $2::bigint WHERE x = $1::numeric AND y = $3"
    assert names == ("b", "a", "c")
    assert numbered("SELECT 1") == ("SELECT 1", ())


def test_a_token_charge_is_at_the_markets_prices_when_written(tenant, market) -> None:
    open_(tenant, market, "r1", "1")
    open_(tenant, market, "r2", "1")
    # The caller read the market before its prices went up: $3 -> $4 per million input.
    stale = Market.objects.get(pk=market.pk)
    market.price_input_per_mtok = D("4")
    market.save()
    # 1000 uncached input tokens at $4/M = 0.004, not 0.003.
    entry = request_settle(
        request_id="r1", prompt_tokens=1000, cached_tokens=0, completion_tokens=0, market=stale
    ).tokens
    assert entry.amount == D("0.004")
    # Another market with the very prices of the request's: its prices are read all the same.
    other = market_create("other")
    other.price_input_per_mtok = D("5")
    other.save()
    market.price_input_per_mtok = D("5")
    market.save()
    entry = request_settle(
        request_id="r2", prompt_tokens=1000, cached_tokens=0, completion_tokens=0, market=other
    ).tokens
    assert entry.amount == D("0.005")
    assert counters_mismatches(tenant) == []
