"""The periodic work celery beat drives: pacing steps, the markets' hold horizons and monthly
invoices.

Both are safe to run again: a pacing step is skipped for an autobidder that stepped less than
half an interval ago (checked with its row locked, so two workers cannot both step it), and an
invoice exists at most once per tenant and period (``invoice_generate`` is idempotent).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from accounts.models import Autobidder, AutobidderStep, Invoice, Tenant
from accounts.services import invoice_generate, previous_month_bounds
from accounts.services.autobidder import autobidder_step

logger = logging.getLogger(__name__)

# After a gap (beat was down), a step looks back at most this many intervals.
MAX_LOOKBACK_INTERVALS = 10


@dataclass
class PacingRun:
    """What one pacing run did, counted in autobidders."""

    stepped: int = 0
    skipped: int = 0  # stepped less than half an interval ago
    failed: int = 0


def autobidders_step_due(*, interval_s: float, now: datetime | None = None) -> PacingRun:
    """One pacing step for every enabled autobidder that is due (``interval_s`` seconds).

    A step covers the spend since the autobidder's previous step, so consecutive steps tile the
    time with no gap and no overlap even when a tick comes late (at most
    ``MAX_LOOKBACK_INTERVALS`` intervals back; the first step looks back one interval). An
    autobidder whose last step is younger than ``interval_s / 2`` is skipped: a rerun of the same
    tick, or a second beat, does not step it twice.
    """
    if not interval_s > 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
    now = now or timezone.now()
    run = PacingRun()
    autobidders = Autobidder.objects.filter(enabled=True).select_related("tenant")
    for auto in autobidders.order_by("tenant_id"):
        try:
            with transaction.atomic():
                # The same row lock autobidder_step takes: the check and the step are one unit.
                locked = Autobidder.objects.select_for_update().filter(pk=auto.pk, enabled=True)
                if not locked.exists():
                    continue
                last = (
                    AutobidderStep.objects.filter(autobidder_id=auto.pk)
                    .order_by("-at")
                    .values_list("at", flat=True)
                    .first()
                )
                since = (now - last).total_seconds() if last is not None else interval_s
                if since < interval_s / 2:
                    run.skipped += 1
                    continue
                covered = min(since, interval_s * MAX_LOOKBACK_INTERVALS)
                autobidder_step(tenant=auto.tenant, interval_s=covered, now=now, every_s=interval_s)
                run.stepped += 1
        except Exception:
            logger.exception("pacing: the step of %s failed", auto)
            run.failed += 1
    return run


@dataclass
class InvoiceRun:
    """What one invoicing run did, counted in tenants."""

    period_start: str
    period_end: str
    created: int = 0
    existing: int = 0
    skipped: int = 0  # the tenant did not exist yet, or the period overlaps another invoice


def invoices_generate_previous_month(*, now: datetime | None = None) -> InvoiceRun:
    """Every tenant's invoice for the previous UTC month, where it is missing.

    Tenants created after the month ended get none. A period that overlaps an invoice made by
    hand is logged and skipped; the other tenants are still invoiced.
    """
    now = now or timezone.now()
    start, end = previous_month_bounds(now=now)
    run = InvoiceRun(period_start=start.isoformat(), period_end=end.isoformat())
    for tenant in Tenant.objects.filter(created_at__lt=end).order_by("slug"):
        if Invoice.objects.filter(tenant=tenant, period_start=start, period_end=end).exists():
            run.existing += 1
            continue
        try:
            invoice_generate(tenant=tenant, period_start=start, period_end=end, now=now)
        except ValueError as exc:
            logger.warning("invoices: %s for %s..%s: %s", tenant.slug, start, end, exc)
            run.skipped += 1
            continue
        run.created += 1
    if run.created:
        logger.info("invoices: %d created for %s..%s", run.created, start.date(), end.date())
    return run
