"""The ledger check (``accounts.selectors.ledger_check``): a clean ledger passes, and each kind
of fault, written into the rows by hand, is found and named."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from accounts.models import BudgetCounter, ChargeKind, Hold, HoldState, LedgerEntry, Request
from accounts.selectors.ledger_check import ledger_check
from accounts.services import request_fail, request_open, request_settle
from tests.accounts.factories import NOW, priority_charge

pytestmark = pytest.mark.django_db
GRACE_S = 1200.0


def _open(tenant, market, rid: str, *, now=NOW) -> None:
    request_open(
        request_id=rid, tenant=tenant, api_key=None, market=market, bid="0.5",
        hold_amount="1", now=now,
    )  # fmt: skip


def _served(tenant, market, rid: str) -> None:
    _open(tenant, market, rid)
    request_settle(
        request_id=rid, prompt_tokens=100, cached_tokens=0, completion_tokens=10,
        priority=priority_charge(0.25), now=NOW,
    )  # fmt: skip


@pytest.fixture
def clean(tenant, market) -> None:
    """Two served requests, one failed, one in flight (queued, within the grace)."""
    _served(tenant, market, "s1")
    _served(tenant, market, "s2")
    _open(tenant, market, "f1")
    request_fail(request_id="f1", now=NOW)
    _open(tenant, market, "q1")


def test_a_clean_ledger_passes(clean, capsys) -> None:
    check = ledger_check(grace_s=GRACE_S, now=NOW + timedelta(seconds=60))
    assert (check.requests, check.served, check.failed, check.queued) == (4, 2, 1, 1)
    assert check.ok, check.lines()
    call_command("ledger_check", "--grace", "1e9")
    assert capsys.readouterr().out.splitlines()[-1] == "ledger check: ok"


def test_a_served_request_without_its_priority_entry_is_found(clean) -> None:
    LedgerEntry.objects.filter(request_id="s1", kind=ChargeKind.PRIORITY).delete()
    check = ledger_check(grace_s=GRACE_S, now=NOW)
    assert check.served_not_charged_once == ["s1"]
    assert check.counters_off  # the counter still counts the deleted entry
    assert not check.ok


def test_an_entry_on_a_failed_request_is_found(clean, tenant, market) -> None:
    entry = LedgerEntry.objects.get(request_id="s2", kind=ChargeKind.TOKENS)
    entry.pk = None
    entry.request_id = "f1"
    entry.save()
    check = ledger_check(grace_s=GRACE_S, now=NOW)
    assert check.charged_not_served == ["f1"]


def test_an_open_hold_of_a_finished_request_and_a_request_queued_too_long_are_found(
    clean,
) -> None:
    Hold.objects.filter(request_id="s2").update(state=HoldState.OPEN, remaining=Decimal("0.5"))
    check = ledger_check(grace_s=GRACE_S, now=NOW + timedelta(seconds=GRACE_S + 1))
    assert check.open_holds_of_finished == ["s2"]
    assert check.queued_past_grace == ["q1"]
    assert check.counters_off  # the reopened hold is not in the counter's held amount


def test_a_counter_off_by_a_nano_dollar_is_found(clean, tenant) -> None:
    counter = BudgetCounter.objects.get(tenant=tenant, api_key=None)
    counter.spent_total += Decimal("0.000000001")
    counter.save()
    check = ledger_check(grace_s=GRACE_S, now=NOW)
    (off,) = check.counters_off
    assert off.startswith(f"tenant {tenant.pk} key -: spent ")
    with pytest.raises(CommandError):
        call_command("ledger_check", "--grace", "1e9")
    assert Request.objects.count() == 4
