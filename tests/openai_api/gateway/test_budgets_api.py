"""``GET /v1/budgets``: a program reads, with its API key, the budgets its requests must fit.

Tenant A (acme) and tenant B (globex) each have a program (``program_create``: a key and a
$100 monthly tenant budget); A has a second key with its own budget and a third with none.
Each key sees its tenant's budget and its own, never another key's nor the other tenant's.
Spend and holds are made with the ledger's services at the real clock (the server reads the
windows from it) and every figure is worked by hand below.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

import httpx
import pytest
from django.utils import timezone

from accounts.services import api_key_create, api_key_revoke, budget_hold, budget_set
from tests.accounts.factories import spend
from tests.openai_api.conftest import market_create
from tests.personas import Program, program_create


def budgets_of(gateway, key: str) -> dict:
    answer = httpx.get(
        f"{gateway.url}/v1/budgets", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    return answer.json()


def midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


@pytest.fixture
def world(acme: Program, transactional_db) -> dict:
    """A's program key ($5 a week), A's second key ($7 a day), A's third key (no budget of its
    own), B's program key ($9 a day); the tenants' own budgets: $100 a month each."""
    globex = program_create("globex")
    second, second_key = api_key_create(tenant=acme.tenant, name="second", created_by=None)
    _, third_key = api_key_create(tenant=acme.tenant, name="third", created_by=None)
    budgets = {
        "a": acme.tenant.budgets.get(api_key=None),
        "a_program": budget_set(tenant=acme.tenant, api_key=acme.api_key, limit="5",
                                period="week"),
        "a_second": budget_set(tenant=acme.tenant, api_key=second, limit="7", period="day"),
        "b": globex.tenant.budgets.get(api_key=None),
        "b_program": budget_set(tenant=globex.tenant, api_key=globex.api_key, limit="9",
                                period="day"),
    }  # fmt: skip
    market = market_create(engine_url="http://127.0.0.1:9")  # settlement only, never called
    now = timezone.now()
    # Spent (a request charged its whole hold) and held (a request in flight), per key:
    for tenant, api_key, rid, charge, held in (
        (acme.tenant, acme.api_key, "a-program", 1.25, "0.5"),
        (acme.tenant, second, "a-second", 2.0, "0.25"),
        (globex.tenant, globex.api_key, "b-program", 3.0, "0.75"),
    ):
        spend(tenant=tenant, market=market, request_id=f"{rid}-spent", charge=charge, at=now,
              api_key=api_key)  # fmt: skip
        budget_hold(tenant=tenant, api_key=api_key, request_id=f"{rid}-held", amount=held,
                    now=now)  # fmt: skip
    keys = {"a_program": acme.key, "a_second": second_key, "a_third": third_key,
            "b_program": globex.key}  # fmt: skip
    return {"now": now, "budgets": budgets, "keys": keys}


def test_a_key_sees_its_tenants_budget_and_its_own_with_spent_and_held_apart(gateway, world):
    now, budgets = world["now"], world["budgets"]
    body = budgets_of(gateway, world["keys"]["a_program"])
    assert body["object"] == "list"
    tenant, own = body["data"]
    # A's month: $1.25 + $2 spent, $0.50 + $0.25 held (both keys); 100 - 3.25 - 0.75 = 96.
    month_start = midnight(now.date().replace(day=1))
    next_month = midnight((now.date().replace(day=28) + timedelta(days=4)).replace(day=1))
    assert tenant == {
        "object": "budget",
        "budget_id": budgets["a"].pk,
        "scope": "tenant",
        "period": "month",
        "currency": "usd",
        "limit": "100.000000000",
        "spent": "3.250000000",
        "held": "0.750000000",
        "remaining": "96.000000000",
        "window_start": month_start.isoformat(),
        "resets_at": next_month.isoformat(),
        "seconds_until_reset": tenant["seconds_until_reset"],
        "soft_alert": False,
    }
    # This key's week (Monday 00:00 UTC on): $1.25 spent, $0.50 held; 5 - 1.25 - 0.5 = 3.25.
    monday = now.date() - timedelta(days=now.weekday())
    assert own == {
        "object": "budget",
        "budget_id": budgets["a_program"].pk,
        "scope": "key",
        "period": "week",
        "currency": "usd",
        "limit": "5.000000000",
        "spent": "1.250000000",
        "held": "0.500000000",
        "remaining": "3.250000000",
        "window_start": midnight(monday).isoformat(),
        "resets_at": midnight(monday + timedelta(days=7)).isoformat(),
        "seconds_until_reset": own["seconds_until_reset"],
        "soft_alert": False,
    }
    for status, end in ((tenant, next_month), (own, midnight(monday + timedelta(days=7)))):
        assert abs(status["seconds_until_reset"] - (end - now).total_seconds()) < 30
    assert body["tenant"] == {
        "month_start": month_start.isoformat(),
        "spent_this_month": "3.250000000",
        "held": "0.750000000",
    }


def test_each_key_sees_only_its_own_budget_beside_its_tenants(gateway, world):
    budgets = world["budgets"]

    def listed(persona: str) -> dict[int, tuple[str, str, str, str]]:
        body = budgets_of(gateway, world["keys"][persona])
        return {b["budget_id"]: (b["scope"], b["spent"], b["held"], b["remaining"])
                for b in body["data"]}  # fmt: skip

    a = (budgets["a"].pk, ("tenant", "3.250000000", "0.750000000", "96.000000000"))
    # A's second key: its day, $2 spent, $0.25 held, 7 - 2 - 0.25 = 4.75; not the program's.
    assert listed("a_second") == dict(
        [a, (budgets["a_second"].pk, ("key", "2.000000000", "0.250000000", "4.750000000"))]
    )
    assert listed("a_third") == dict([a])  # no budget of its own: the tenant's only
    # B: $3 spent, $0.75 held; month 100 - 3.75 = 96.25, day 9 - 3.75 = 5.25. Nothing of A's.
    assert listed("b_program") == {
        budgets["b"].pk: ("tenant", "3.000000000", "0.750000000", "96.250000000"),
        budgets["b_program"].pk: ("key", "3.000000000", "0.750000000", "5.250000000"),
    }
    body = budgets_of(gateway, world["keys"]["b_program"])
    assert body["tenant"] == {
        "month_start": body["tenant"]["month_start"],
        "spent_this_month": "3.000000000",
        "held": "0.750000000",
    }


def test_a_tenant_without_budgets_lists_none_and_still_says_its_month(gateway, transactional_db):
    program = program_create("initech")
    program.tenant.budgets.all().delete()
    body = budgets_of(gateway, program.key)
    assert body["data"] == []
    assert (body["tenant"]["spent_this_month"], body["tenant"]["held"]) == (
        "0.000000000",
        "0.000000000",
    )


def test_a_period_none_budget_never_resets(gateway, acme):
    budget_set(tenant=acme.tenant, limit="2", period="none")
    (tenant,) = budgets_of(gateway, acme.key)["data"]
    assert (tenant["period"], tenant["limit"]) == ("none", "2.000000000")
    assert tenant["window_start"] == "1970-01-01T00:00:00+00:00"
    assert (tenant["resets_at"], tenant["seconds_until_reset"]) == (None, None)


def test_401_without_a_valid_key_and_405_for_another_method(gateway, acme):
    revoked, revoked_key = api_key_create(tenant=acme.tenant, name="old", created_by=None)
    api_key_revoke(api_key=revoked)
    well_formed_unknown = "im_" + "0" * 12 + "_" + "A" * 43
    for headers in (
        {},
        {"Authorization": "Bearer nope"},
        {"Authorization": f"Bearer {well_formed_unknown}"},
        {"Authorization": f"Bearer {revoked_key}"},
    ):
        answer = httpx.get(f"{gateway.url}/v1/budgets", headers=headers, timeout=30)
        assert answer.status_code == 401, (headers, answer.text)
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
    answer = httpx.post(
        f"{gateway.url}/v1/budgets", headers={"Authorization": f"Bearer {acme.key}"}, timeout=30
    )
    assert answer.status_code == 405
    assert answer.json()["error"]["code"] == "method_not_allowed"
