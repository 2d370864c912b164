"""Holds sized to what a request can really cost (issue 29): with the demo's budget, tenants
can bid. A request holds its tokens' worst case and its effective bid x the market's hold
horizon (1 s on a market with no history), not bid x ``max_wait_s``; the priority cap (what the
tenant consented to) stays bid x ``max_wait_s``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest

from accounts.models import ChargeKind, Hold, HoldState, LedgerEntry, Request, RequestStatus
from accounts.selectors import budget_status
from tests.openai_api.helpers import HELLO
from tests.personas import program_create

pytestmark = [pytest.mark.django_db(transaction=True)]

DEMO_BUDGET = "50"  # dollars a month: the demo tenants' budget (accounts.services.tenants)


def test_twenty_concurrent_requests_at_bid_0_1_fit_the_demos_budget(gateway, market) -> None:
    # Each used to hold its worst case, $0.1/s x 60 s = $6: 8 fitted in $50, 12 got 402. Now
    # each holds its tokens' worst case (16 x $3 + 8 x $15 per million = $0.000168) and
    # $0.1/s x 1 s: $0.100168, and 20 of them $2.00336.
    acme = program_create("acme", budget=DEMO_BUDGET)
    client = acme.client(gateway)

    def ask(_: int):
        return client.chat.completions.create(
            model=market.served_model, messages=HELLO, max_tokens=8, extra_body={"bid": "0.1"}
        )

    with ThreadPoolExecutor(max_workers=20) as pool:
        replies = list(pool.map(ask, range(20)))
    assert [r.choices[0].finish_reason for r in replies] == ["length"] * 20
    requests = Request.objects.filter(tenant=acme.tenant)
    assert requests.count() == 20
    assert set(requests.values_list("status", flat=True)) == {RequestStatus.SERVED}
    assert set(requests.values_list("priority_cap", flat=True)) == {Decimal("6")}
    holds = Hold.objects.filter(tenant=acme.tenant)
    assert set(holds.values_list("amount", "state")) == {(Decimal("0.100168"), HoldState.SETTLED)}
    # Every request charged once, both parts; nothing left held.
    entries = LedgerEntry.objects.filter(tenant=acme.tenant)
    assert entries.filter(kind=ChargeKind.TOKENS).count() == 20
    assert entries.filter(kind=ChargeKind.PRIORITY).count() == 20
    status = budget_status(tenant=acme.tenant)
    assert status.held == 0
    assert status.spent == sum(entries.values_list("amount", flat=True), Decimal(0))


def test_a_request_at_bid_1_is_served_on_the_demos_budget(gateway, market) -> None:
    # Its worst case, $1/s x 60 s = $60, is over the whole $50: it could never be sent. It
    # holds its tokens and $1/s x 1 s, and pays what it is charged.
    acme = program_create("acme", budget=DEMO_BUDGET)
    reply = acme.client(gateway).chat.completions.create(
        model=market.served_model, messages=HELLO, max_tokens=4, extra_body={"bid": "1"}
    )
    assert reply.choices[0].finish_reason == "length"
    (request,) = Request.objects.filter(tenant=acme.tenant)
    assert (request.status, request.priority_cap) == (RequestStatus.SERVED, Decimal("60"))
    # 16 x $3 + 4 x $15 per million = $0.000108, plus $1.
    assert Hold.objects.get(request_id=request.request_id).amount == Decimal("1.000108")
    auction = reply.model_extra["auction"]
    assert auction["effective_bid"] == "1.000000000" and auction["priority_charge"] is not None
