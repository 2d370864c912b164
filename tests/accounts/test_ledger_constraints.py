"""The database itself keeps the ledger honest: one entry per (request, kind), no negative
amounts, whatever code writes to it."""

from datetime import UTC, datetime
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from accounts.models import ChargeKind, Invoice, LedgerEntry
from tests.accounts.factories import market_create, spend, tenant_create

pytestmark = pytest.mark.django_db

AT = datetime(2026, 10, 5, tzinfo=UTC)


@pytest.fixture
def entry() -> LedgerEntry:
    tenant = tenant_create("acme")
    spend(tenant=tenant, market=market_create(), request_id="r1", charge=0.5, at=AT)
    return LedgerEntry.objects.get(request_id="r1", kind=ChargeKind.PRIORITY)


def copy_of(entry: LedgerEntry, **changes) -> LedgerEntry:
    fields = {
        "request_id": entry.request_id,
        "kind": entry.kind,
        "tenant_id": entry.tenant_id,
        "market_id": entry.market_id,
        "amount": entry.amount,
        "created_at": entry.created_at,
    }
    return LedgerEntry(**{**fields, **changes})


def test_a_second_entry_of_the_same_kind_is_refused_by_the_database(entry) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        copy_of(entry).save()
    assert LedgerEntry.objects.filter(request_id="r1").count() == 2  # priority + tokens


def test_a_negative_amount_is_refused_by_the_database(entry) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.filter(pk=entry.pk).update(amount=Decimal("-1"))


def test_the_unique_key_is_request_id_and_kind_on_postgres(entry) -> None:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "accounts_ledgerentry")
    unique = constraints["ledger_one_per_request_kind"]
    assert unique["unique"] is True
    assert unique["columns"] == ["request_id", "kind"]
    column = {
        c.name: c
        for c in connection.introspection.get_table_description(
            connection.cursor(), "accounts_ledgerentry"
        )
    }["amount"]
    assert (column.precision, column.scale) == (20, 9)


def test_the_invoices_command_generates_a_month_once(entry) -> None:
    out = StringIO()
    call_command("invoices_generate", "--month", "2026-10", stdout=out)
    call_command("invoices_generate", "--month", "2026-10", stdout=out)
    invoice = Invoice.objects.get()
    # 0.5 priority + 0 tokens (the factory completes with no tokens).
    assert invoice.total == Decimal("0.5")
    assert out.getvalue().count("$0.500000000") == 2
