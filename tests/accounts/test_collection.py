"""What the ledger collected and what cuts left out (``accounts.selectors.collection``),
against hand-worked sums."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.management import call_command

from accounts.models import Period
from accounts.selectors.collection import collection
from accounts.services import budget_set, hold_release, request_open, request_settle
from tests.accounts.factories import NOW, priority_charge

pytestmark = pytest.mark.django_db

D = Decimal


def test_cuts_are_told_apart_and_summed(tenant, market, capsys) -> None:
    budget_set(tenant=tenant, limit="0.01", period=Period.DAY)

    def opened(rid, hold, cap):
        request_open(request_id=rid, tenant=tenant, api_key=None, market=market, bid="0.001",
                     hold_amount=hold, priority_cap=cap, now=NOW)  # fmt: skip

    def settled(rid, charge):
        request_settle(request_id=rid, prompt_tokens=0, cached_tokens=0, completion_tokens=0,
                       priority=priority_charge(charge), now=NOW)  # fmt: skip

    opened("a", "0.005", D("0.004"))
    settled("a", 0.004)  # in full
    opened("b", "0.001", D("0.004"))
    settled("b", 0.006)  # room 0.001 + 0.005 left = 0.006; its cap, 0.004, binds: 0.002 never owed
    opened("c", "0.001", None)
    hold_release(request_id="c", now=NOW)
    settled("c", 0.003)  # spent 0.008, hold released: room 0.002, so 0.001 uncollected
    got = collection()
    assert (got.priority, got.tokens) == (D("0.010"), D(0))  # 0.004 + 0.004 + 0.002
    assert (got.uncollected, got.over_consent, got.given_away) == (D("0.001"), D("0.002"), D(0))
    assert got.uncollected_share == pytest.approx(0.1)
    assert collection(tenant_id=tenant.pk + 1) == type(got)(D(0), D(0), D(0), D(0), D(0))
    call_command("collection_report")
    out = capsys.readouterr().out
    assert "priority revenue $0.010000000" in out and "uncollected $0.001000000 (10.000%)" in out
