"""Budgets: holds, windows computed from the clock, and the LiteLLM proxy's budget bugs.

"now" is passed to the services explicitly: no clock is patched. Amounts are hand-computed.
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from accounts.models import Hold, HoldState, Period
from accounts.selectors import budget_status, budget_statuses_for_tenant
from accounts.services import (
    BudgetExhausted,
    api_key_create,
    api_key_revoke,
    budget_hold,
    budget_set,
    hold_release,
    request_open,
    request_settle,
)
from tests.accounts.factories import (
    MIDNIGHT,
    NOW,
    priority_charge,
    spend,
    tenant_create,
)

pytestmark = pytest.mark.django_db

D = Decimal


def hold(tenant, amount, rid, *, key=None, now=NOW) -> Hold:
    return budget_hold(tenant=tenant, api_key=key, request_id=rid, amount=amount, now=now)


def test_holds_fill_the_budget_to_the_cent_and_a_refusal_says_when_it_resets(tenant) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    hold(tenant, D("0.6"), "r1")
    with pytest.raises(BudgetExhausted) as refused:
        hold(tenant, D("0.5"), "r2")
    # 1 - 0.6 = 0.4 left; NOW is 15:30 UTC, the day resets at midnight: 8.5 hours.
    assert refused.value.remaining == D("0.4")
    assert refused.value.seconds_until_reset == 8.5 * 3600
    assert refused.value.resets_at == datetime(2026, 11, 19, tzinfo=UTC)
    assert refused.value.scope == "tenant"
    assert refused.value.reason == "exceeds_remaining"
    assert "is more than the $0.40 left" in str(refused.value)
    hold(tenant, D("0.4"), "r3")  # exactly at the limit: 0.6 + 0.4 = 1
    assert not Hold.objects.filter(request_id="r2").exists()
    status = budget_status(tenant=tenant, now=NOW)
    assert (status.spent, status.held, status.remaining) == (D(0), D("1"), D(0))


def test_hold_is_idempotent_per_request(tenant) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    first = hold(tenant, D("0.6"), "r1")
    again = hold(tenant, D("0.6"), "r1")
    assert first.pk == again.pk
    assert budget_status(tenant=tenant, now=NOW).held == D("0.6")


def test_a_hold_for_another_tenants_request_id_is_refused(tenant) -> None:
    other = tenant_create("globex")
    hold(tenant, D("0.1"), "r1")
    with pytest.raises(ValueError, match="another tenant"):
        hold(other, D("0.1"), "r1")


# --- LiteLLM regression: budgets not enforced for some key types ------------------------------


def test_litellm_budget_not_enforced_for_some_key_types_key_with_its_own_budget(tenant) -> None:
    budget_set(tenant=tenant, limit="10", period=Period.DAY)
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None, budget_limit="0.5")
    with pytest.raises(BudgetExhausted) as refused:
        hold(tenant, D("0.6"), "r1", key=key)
    assert refused.value.scope == "key"
    assert refused.value.remaining == D("0.5")
    hold(tenant, D("0.6"), "r2")  # the tenant itself still has room


def test_litellm_budget_not_enforced_for_some_key_types_key_without_a_budget(tenant) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None)
    with pytest.raises(BudgetExhausted) as refused:
        hold(tenant, D("1.2"), "r1", key=key)
    assert refused.value.scope == "tenant"


def test_litellm_budget_not_enforced_for_some_key_types_key_budget_above_tenant(tenant) -> None:
    # A generous key budget does not lift the tenant's.
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None, budget_limit="10")
    with pytest.raises(BudgetExhausted) as refused:
        hold(tenant, D("2"), "r1", key=key)
    assert refused.value.scope == "tenant"


def test_litellm_budget_not_enforced_for_some_key_types_tenant_without_budget(tenant) -> None:
    limited, _ = api_key_create(tenant=tenant, name="k1", created_by=None, budget_limit="0.5")
    unlimited, _ = api_key_create(tenant=tenant, name="k2", created_by=None)
    with pytest.raises(BudgetExhausted) as refused:
        hold(tenant, D("0.6"), "r1", key=limited)
    assert refused.value.scope == "key"
    # No budget applies to the other key: nothing caps it (and the hold is still recorded).
    hold(tenant, D("1000"), "r2", key=unlimited)
    assert budget_status(tenant=tenant, api_key=unlimited, now=NOW) is None


def test_key_budget_counts_only_that_keys_spend(tenant, market) -> None:
    key1, _ = api_key_create(tenant=tenant, name="k1", created_by=None, budget_limit="1")
    key2, _ = api_key_create(tenant=tenant, name="k2", created_by=None)
    spend(tenant=tenant, market=market, request_id="a", charge=0.75, at=NOW, api_key=key2)
    spend(tenant=tenant, market=market, request_id="b", charge=0.25, at=NOW, api_key=key1)
    status = budget_status(tenant=tenant, api_key=key1, now=NOW)
    assert (status.scope, status.spent, status.remaining) == ("key", D("0.25"), D("0.75"))


def test_revoked_and_foreign_keys_cannot_hold(tenant) -> None:
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None)
    other = tenant_create("globex")
    with pytest.raises(ValueError, match="another tenant"):
        hold(other, D("0.1"), "r1", key=key)
    api_key_revoke(api_key=key)
    with pytest.raises(ValueError, match="revoked"):
        hold(tenant, D("0.1"), "r2", key=key)


# --- LiteLLM regression: spend never resetting ---------------------------------------------------


def test_litellm_spend_never_resetting(tenant, market) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    spend(tenant=tenant, market=market, request_id="y", charge=0.9, at=NOW - timedelta(days=1))
    assert budget_status(tenant=tenant, now=NOW - timedelta(days=1)).spent == D("0.9")
    # A new day: the window starts at 0 without any job having run.
    status = budget_status(tenant=tenant, now=NOW)
    assert (status.spent, status.remaining) == (D(0), D("1"))
    hold(tenant, D("1"), "today")


@pytest.mark.parametrize(
    ("period", "last_window", "this_window"),
    [
        (
            Period.WEEK,
            datetime(2026, 11, 15, 23, 59, tzinfo=UTC),
            datetime(2026, 11, 16, tzinfo=UTC),
        ),
        (
            Period.MONTH,
            datetime(2026, 10, 31, 23, 59, tzinfo=UTC),
            datetime(2026, 11, 1, tzinfo=UTC),
        ),
    ],
)
def test_weekly_and_monthly_spend_starts_again_at_the_boundary(
    tenant, market, period, last_window, this_window
) -> None:
    budget_set(tenant=tenant, limit="1", period=period)
    spend(tenant=tenant, market=market, request_id="old", charge=0.5, at=last_window)
    assert budget_status(tenant=tenant, now=last_window).spent == D("0.5")
    assert budget_status(tenant=tenant, now=this_window).spent == D(0)


def test_period_none_never_resets(tenant, market) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.NONE)
    spend(tenant=tenant, market=market, request_id="old", charge=0.5, at=NOW - timedelta(days=400))
    status = budget_status(tenant=tenant, now=NOW)
    assert (status.spent, status.resets_at, status.seconds_until_reset) == (D("0.5"), None, None)


# --- LiteLLM regression: resetting on top of fresh spend -----------------------------------------


def test_litellm_resetting_on_top_of_fresh_spend(tenant, market) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    spend(
        tenant=tenant,
        market=market,
        request_id="late",
        charge=0.7,
        at=MIDNIGHT - timedelta(seconds=1),
    )
    spend(
        tenant=tenant,
        market=market,
        request_id="early",
        charge=0.2,
        at=MIDNIGHT + timedelta(milliseconds=500),
    )
    # Just after midnight the new day's fresh 0.2 is kept; only yesterday's 0.7 is out.
    status = budget_status(tenant=tenant, now=MIDNIGHT + timedelta(seconds=1))
    assert (status.spent, status.remaining) == (D("0.2"), D("0.8"))
    with pytest.raises(BudgetExhausted):
        hold(tenant, D("0.81"), "too-much", now=MIDNIGHT + timedelta(seconds=2))
    hold(tenant, D("0.8"), "fits", now=MIDNIGHT + timedelta(seconds=2))
    # And reading the old day again still shows the old day's spend.
    assert budget_status(tenant=tenant, now=MIDNIGHT - timedelta(seconds=1)).spent == D("0.7")


# --- LiteLLM regression: a window applied on update causing an immediate refusal -----------------


def test_litellm_window_applied_on_update_causes_immediate_refusal(tenant, market) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.MONTH)
    spend(
        tenant=tenant,
        market=market,
        request_id="nov5",
        charge=0.6,
        at=datetime(2026, 11, 5, tzinfo=UTC),
    )
    # Mid-month, the operator switches the budget to daily: today's window has spent nothing.
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    status = budget_status(tenant=tenant, now=NOW)
    assert (status.spent, status.remaining) == (D(0), D("1"))
    assert status.resets_at == datetime(2026, 11, 19, tzinfo=UTC)  # the calendar, not now + 1 day
    hold(tenant, D("0.9"), "fits-daily")
    hold_release(request_id="fits-daily", now=NOW)
    # Back to monthly with a higher limit: 0.6 spent + 0.8 = 1.4 <= 1.5 fits at once.
    budget_set(tenant=tenant, limit="1.5", period=Period.MONTH)
    hold(tenant, D("0.8"), "fits-monthly")
    with pytest.raises(BudgetExhausted) as refused:
        hold(tenant, D("0.2"), "over")  # 0.6 + 0.8 + 0.2 = 1.6 > 1.5
    assert refused.value.remaining == D("0.1")


def test_lowering_the_limit_below_spend_refuses_but_shows_zero_remaining(tenant, market) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.MONTH)
    spend(tenant=tenant, market=market, request_id="a", charge=0.6, at=NOW)
    budget_set(tenant=tenant, limit="0.5", period=Period.MONTH)
    status = budget_status(tenant=tenant, now=NOW)
    assert (status.spent, status.remaining) == (D("0.6"), D(0))
    with pytest.raises(BudgetExhausted):
        hold(tenant, D("0.000000001"), "b")


# --- holds through a request's life ---------------------------------------------------------------


def test_release_frees_the_hold_without_a_charge(tenant) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    hold(tenant, D("1"), "r1")
    with pytest.raises(BudgetExhausted):
        hold(tenant, D("0.1"), "r2")
    assert hold_release(request_id="r1", now=NOW) is True
    assert hold_release(request_id="r1", now=NOW) is False
    assert Hold.objects.get(request_id="r1").state == HoldState.RELEASED
    status = budget_status(tenant=tenant, now=NOW)
    assert (status.spent, status.held) == (D(0), D(0))
    hold(tenant, D("1"), "r3")


def test_settlement_turns_the_hold_into_spend(tenant, market) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    request_open(
        request_id="r1",
        tenant=tenant,
        api_key=None,
        market=market,
        bid="0.5",
        hold_amount="0.5",
        now=NOW,
    )
    # In flight: the whole hold reserved.
    status = budget_status(tenant=tenant, now=NOW)
    assert (status.spent, status.held) == (D(0), D("0.5"))
    # Tokens: 200 uncached x $3/M + 1000 cached x $0.30/M + 500 output x $15/M
    #       = 0.0006 + 0.0003 + 0.0075 = 0.0084; then the engine's priority charge 0.1.
    request_settle(
        request_id="r1", prompt_tokens=1200, cached_tokens=1000, completion_tokens=500,
        priority=priority_charge(0.1), now=NOW,
    )  # fmt: skip
    status = budget_status(tenant=tenant, now=NOW)
    assert (status.spent, status.held, status.remaining) == (D("0.1084"), D(0), D("0.8916"))
    assert Hold.objects.get(request_id="r1").state == HoldState.SETTLED


def test_a_charge_above_its_hold_is_charged_in_full_while_the_budget_has_room(
    tenant, market
) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    request_open(
        request_id="r1",
        tenant=tenant,
        api_key=None,
        market=market,
        bid="0.5",
        hold_amount="0.01",
        now=NOW,
    )
    request_settle(
        request_id="r1", prompt_tokens=0, cached_tokens=0, completion_tokens=0,
        priority=priority_charge(0.25), now=NOW,
    )  # fmt: skip
    status = budget_status(tenant=tenant, now=NOW)
    assert (status.spent, status.held) == (D("0.25"), D(0))
    with pytest.raises(BudgetExhausted):
        hold(tenant, D("0.76"), "r2")
    hold(tenant, D("0.75"), "r3")


def test_open_holds_count_across_a_window_boundary(tenant) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    hold(tenant, D("0.7"), "in-flight", now=MIDNIGHT - timedelta(seconds=1))
    # The request is still in flight after midnight: its money stays reserved.
    status = budget_status(tenant=tenant, now=MIDNIGHT + timedelta(seconds=1))
    assert (status.spent, status.held, status.remaining) == (D(0), D("0.7"), D("0.3"))


def test_soft_alert_and_the_binding_budget(tenant, market) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.DAY, soft_alert_fraction="0.5")
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None, budget_limit="0.3")
    spend(tenant=tenant, market=market, request_id="a", charge=0.25, at=NOW, api_key=key)
    assert budget_status(tenant=tenant, now=NOW).soft_alert is False  # 0.25 < 0.5
    # The key has 0.05 left, the tenant 0.75: the key's budget binds.
    binding = budget_status(tenant=tenant, api_key=key, now=NOW)
    assert (binding.scope, binding.remaining) == ("key", D("0.05"))
    assert binding.soft_alert is True  # 0.25 >= 0.8 x 0.3 = 0.24
    spend(tenant=tenant, market=market, request_id="b", charge=0.25, at=NOW)
    assert budget_status(tenant=tenant, now=NOW).soft_alert is True  # 0.5 >= 0.5
    scopes = [s.scope for s in budget_statuses_for_tenant(tenant=tenant, now=NOW)]
    assert scopes == ["tenant", "key"]


def test_budget_set_validates(tenant) -> None:
    other_key, _ = api_key_create(tenant=tenant_create("globex"), name="k", created_by=None)
    with pytest.raises(ValueError):
        budget_set(tenant=tenant, limit="-1")
    with pytest.raises(ValueError):
        budget_set(tenant=tenant, limit="1", period="fortnight")
    with pytest.raises(ValueError):
        budget_set(tenant=tenant, limit="1", soft_alert_fraction="1.5")
    with pytest.raises(ValueError):
        budget_set(tenant=tenant, limit="1", soft_alert_fraction="0.12345")
    with pytest.raises(ValueError):
        budget_set(tenant=tenant, limit="1", api_key=other_key)
    with pytest.raises(ValueError):
        budget_set(tenant=tenant, limit="0.0000000001")


def test_the_refusal_prints_amounts_in_fixed_notation(tenant) -> None:
    budget_set(tenant=tenant, limit="0", period=Period.DAY)
    with pytest.raises(BudgetExhausted) as refused:
        hold(tenant, D("0.000000001"), "r1")
    message = str(refused.value)
    assert "$0.00 left; this request needs up to $0.000000001." in message
    assert "E-" not in message


def test_the_refusal_says_which_budget_its_spent_held_and_left_and_when_it_resets(
    tenant, market
) -> None:
    key, _ = api_key_create(tenant=tenant, name="k", created_by=None)
    budget_set(tenant=tenant, limit="1000", period=Period.MONTH)
    budget_set(tenant=tenant, limit="2.5", period=Period.WEEK, api_key=key)
    spend(tenant=tenant, market=market, request_id="s1", charge=1.25, at=NOW, api_key=key)
    hold(tenant, D("0.75"), "h1", key=key)
    with pytest.raises(BudgetExhausted) as refused:
        hold(tenant, D("0.500123456"), "h2", key=key)
    # The key's week: 2.5 - 1.25 spent - 0.75 held = 0.5 left < 0.500123456. Both read $0.50
    # to three significant digits, so the sentence gives both all their digits. NOW is
    # Wednesday 2026-11-18 15:30 UTC; the week ends Monday 2026-11-23 00:00, 4 days 8.5 hours
    # later (4 x 86400 + 8.5 x 3600 = 376200 s): "4 d 8 h", floored.
    # The key's budget has room: this request's hold is more than what is left.
    assert refused.value.reason == "exceeds_remaining"
    assert str(refused.value) == (
        "This request's hold, up to $0.500123456, is more than the $0.50 left of this API "
        "key's budget of $2.50 per week ($1.25 spent, $0.75 held for requests in flight). The "
        "hold is the prompt and max_tokens at the market's prices plus the bid times the "
        "market's hold horizon: lower the bid or max_tokens, or raise the budget. It resets at "
        "2026-11-23T00:00:00+00:00 (in 4 d 8 h)."
    )
    budget_set(tenant=tenant, limit="1.75", period=Period.NONE)  # the tenant's, now binding
    with pytest.raises(BudgetExhausted) as refused:
        hold(tenant, D("0.25"), "h3", key=key)
    # 1.75 - 1.25 - 0.75 = -0.25: nothing left (the limit was lowered under what is used)
    assert refused.value.reason == "used_up"
    assert str(refused.value) == (
        "The tenant's budget of $1.75 with no period is used up: $1.25 spent, $0.75 held "
        "for requests in flight, $0.00 left; this request needs up to $0.25. It never resets. "
        "Retry once requests in flight finish (what they hold and do not spend comes back), "
        "or raise the budget."
    )
    assert refused.value.figures() == {
        "reason": "used_up",
        "budget_id": refused.value.status.budget_id,
        "scope": "tenant",
        "period": "none",
        "limit": "1.750000000",
        "spent": "1.250000000",
        "held": "0.750000000",
        "remaining": "0.000000000",
        "needed": "0.250000000",
        "resets_at": None,
        "seconds_until_reset": None,
    }


def test_a_hold_larger_than_a_fresh_budget_is_not_called_exhausted(tenant) -> None:
    """Issue 48, item 4: a fresh $0.002/day budget and a first request whose hold (mostly its
    bid x the hold horizon) is $0.0134: nothing is spent or held, the hold is larger than the
    whole budget. The refusal says so, and what to do."""
    budget_set(tenant=tenant, limit="0.002", period=Period.DAY)
    with pytest.raises(BudgetExhausted) as refused:
        hold(tenant, D("0.0134"), "r1")
    assert refused.value.reason == "exceeds_remaining"
    message = str(refused.value)
    assert "exhausted" not in message and "used up" not in message
    assert message == (
        "This request's hold, up to $0.0134, is more than the $0.002 left of the tenant's "
        "budget of $0.002 per day ($0.00 spent, $0.00 held for requests in flight); it is more "
        "than the whole budget, so the reset will not make room. The hold is the prompt and "
        "max_tokens at the market's prices plus the bid times the market's hold horizon: lower "
        "the bid or max_tokens, or raise the budget. It resets at 2026-11-19T00:00:00+00:00 "
        "(in 8 h 30 min)."
    )
    figures = refused.value.figures()
    assert {k: figures[k] for k in ("limit", "spent", "held", "remaining", "needed")} == {
        "limit": "0.002000000",
        "spent": "0.000000000",
        "held": "0.000000000",
        "remaining": "0.002000000",
        "needed": "0.013400000",
    }
    assert (figures["resets_at"], figures["seconds_until_reset"]) == (
        "2026-11-19T00:00:00+00:00",
        8.5 * 3600,
    )


def test_a_budget_used_up_by_spend_says_to_wait_for_the_reset(tenant, market) -> None:
    budget_set(tenant=tenant, limit="1", period=Period.DAY)
    spend(tenant=tenant, market=market, request_id="s1", charge=1.0, at=NOW)
    with pytest.raises(BudgetExhausted) as refused:
        hold(tenant, D("0.1"), "r1")
    assert refused.value.reason == "used_up"
    assert str(refused.value) == (
        "The tenant's budget of $1.00 per day is used up: $1.00 spent, $0.00 held for "
        "requests in flight, $0.00 left; this request needs up to $0.10. It resets at "
        "2026-11-19T00:00:00+00:00 (in 8 h 30 min). Retry after the reset, or raise the budget."
    )
