"""Invoices: one per tenant and period, built from the ledger, idempotent.

A line per request with both parts (priority and tokens) of the entries created in the period;
totals are exact sums of the ledger amounts (no rounding: the amounts were rounded once, when
they were charged).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import ChargeKind, Invoice, InvoiceLine, LedgerEntry, Tenant
from accounts.models.ledger import TOKEN_COUNTS
from accounts.money import ZERO


@dataclass
class _Line:
    market_id: int
    round_id: str = ""
    priority: Decimal = ZERO
    tokens: Decimal = ZERO
    usage: dict[str, int] = field(default_factory=dict)


def month_bounds(*, year: int, month: int) -> tuple[datetime, datetime]:
    """The UTC calendar month ``[start, end)``."""
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def previous_month_bounds(*, now: datetime) -> tuple[datetime, datetime]:
    """The UTC calendar month before the one ``now`` falls in, ``[start, end)``: the latest
    month that can be invoiced (it is over)."""
    first_of_this_month = now.astimezone(UTC).replace(day=1)
    last_month = first_of_this_month - timedelta(days=1)
    return month_bounds(year=last_month.year, month=last_month.month)


def invoice_generate(
    *,
    tenant: Tenant,
    period_start: datetime,
    period_end: datetime,
    now: datetime | None = None,
) -> Invoice:
    """The invoice of ``tenant`` for the ledger entries created in ``[period_start, period_end)``.

    Idempotent: an invoice for the same tenant and period is returned unchanged. The period must
    be over (``period_end <= now``), so no entry can still land in it, and must not overlap
    another invoice of the tenant (ValueError otherwise).
    """
    now = now or timezone.now()
    if period_start.tzinfo is None or period_end.tzinfo is None:
        raise ValueError("invoice periods must be timezone-aware")
    if not period_start < period_end:
        raise ValueError("an invoice period must end after it starts")
    existing = Invoice.objects.filter(
        tenant=tenant, period_start=period_start, period_end=period_end
    ).first()
    if existing is not None:
        return existing
    if period_end > now:
        raise ValueError("the period is not over yet")
    overlapping = Invoice.objects.filter(
        tenant=tenant, period_start__lt=period_end, period_end__gt=period_start
    )
    if overlapping.exists():
        raise ValueError("the period overlaps an invoice of this tenant")
    entries = LedgerEntry.objects.filter(
        tenant=tenant, created_at__gte=period_start, created_at__lt=period_end
    )
    lines: dict[str, _Line] = {}
    for entry in entries.order_by("created_at", "id"):
        line = lines.setdefault(entry.request_id, _Line(market_id=entry.market_id))
        if entry.kind == ChargeKind.PRIORITY:
            line.priority += entry.amount
            line.round_id = entry.round_id
        else:
            line.tokens += entry.amount
            # The usage the token charge was computed from (only when charged in this period).
            line.usage = {name: int(entry.detail.get(name, 0)) for name in TOKEN_COUNTS}
    priority_total = sum((line.priority for line in lines.values()), ZERO)
    tokens_total = sum((line.tokens for line in lines.values()), ZERO)
    try:
        with transaction.atomic():
            invoice = Invoice.objects.create(
                tenant=tenant,
                period_start=period_start,
                period_end=period_end,
                priority_total=priority_total,
                tokens_total=tokens_total,
                total=priority_total + tokens_total,
                created_at=now,
            )
            InvoiceLine.objects.bulk_create(
                InvoiceLine(
                    invoice=invoice,
                    request_id=request_id,
                    market_id=line.market_id,
                    round_id=line.round_id,
                    priority_amount=line.priority,
                    tokens_amount=line.tokens,
                    total=line.priority + line.tokens,
                    **line.usage,
                )
                for request_id, line in lines.items()
            )
    except IntegrityError:
        # Generated concurrently for the same period: theirs is as good as ours.
        return Invoice.objects.get(tenant=tenant, period_start=period_start, period_end=period_end)
    return invoice
