"""Periodic work: pacing steps once per interval, invoices once per tenant and month.

Hand-worked numbers; the pacing rule is log(1 + mu) <- clip(log(1 + mu) + eta (spent / target -
1), 0, log(1 + mu_max)) with eta = eta0 / sqrt(steps in a day) and target = remaining budget x
interval / seconds left in the day (mechanism.pacing).
"""

from __future__ import annotations

import math
import os
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings

from accounts.models import AutobidderStep, BidSource, ChargeKind, Invoice, LedgerEntry, Request
from accounts.models import Tenant as TenantModel
from accounts.services import previous_month_bounds
from accounts.services.autobidder import autobidder_configure
from accounts.services.periodic import (
    autobidders_step_due,
    invoices_generate_previous_month,
)
from accounts.tasks import autobidders_step, invoices_generate
from tests.accounts.factories import market_create, spend, tenant_create
from tests.scheduler_bridge.workers import celery_worker

NOON = datetime(2026, 11, 18, 12, 0, tzinfo=UTC)
NANO = Decimal("1E-9")


def autobid_charge(tenant, market, rid: str, amount: Decimal, *, at: datetime) -> None:
    """A served autobid request whose priority charge was ``amount`` dollars at ``at``."""
    request = Request.objects.create(
        request_id=rid, tenant=tenant, market=market, created_at=at, bid_source=BidSource.AUTOBID
    )
    LedgerEntry.objects.create(
        request=request, kind=ChargeKind.PRIORITY, tenant=tenant, market=market, amount=amount,
        created_at=at, detail={},
    )  # fmt: skip


ETA = 0.5 / math.sqrt(86_400 / 10)  # eta0 0.5, a step every 10 s


def configure(slug: str, *, enabled: bool = True):
    tenant = tenant_create(slug)
    autobidder_configure(
        tenant=tenant, enabled=enabled, budget="86.40", period="day",
        values={"interactive": "0.5"}, eta=0.5,
    )  # fmt: skip
    return tenant


def mus(tenant) -> list[float]:
    return list(
        AutobidderStep.objects.filter(autobidder__tenant=tenant)
        .order_by("at")
        .values_list("mu", flat=True)
    )


@pytest.mark.django_db
def test_each_enabled_autobidder_steps_once_per_interval() -> None:
    acme, globex, idle = configure("acme"), configure("globex"), configure("idle", enabled=False)
    market = market_create()
    # acme spends twice its target in the 10 s before noon. At 11:59:50, 43,210 s of the day
    # are left and nothing is spent: target = 86.40 x 10 / 43,210; gradient +1. A day has 8,640
    # steps of 10 s: eta = 0.5 / sqrt(8640), and log(1 + mu) = eta.
    target_1 = Decimal("86.40") * 10 / 43_210
    charge_1 = (2 * target_1).quantize(NANO)
    autobid_charge(acme, market, "a1", charge_1, at=NOON - timedelta(seconds=5))

    run = autobidders_step_due(interval_s=10, now=NOON)
    assert (run.stepped, run.skipped, run.failed) == (2, 0, 0)  # acme and globex, not idle
    assert mus(acme) == [pytest.approx(math.expm1(ETA), abs=1e-9)]
    assert mus(globex) == [0.0]  # spent nothing: gradient -1, clipped at 0
    assert mus(idle) == []

    # The same tick again, 3 s later (< half the interval): nobody steps twice.
    rerun = autobidders_step_due(interval_s=10, now=NOON + timedelta(seconds=3))
    assert (rerun.stepped, rerun.skipped) == (0, 2)
    assert len(mus(acme)) == len(mus(globex)) == 1

    # The next tick comes 7 s after the last step (>= half): the step covers exactly those 7 s.
    # From 12:00:00, 43,200 s are left and 86.40 - charge_1 remains: target = that x 7 / 43,200.
    target_2 = (Decimal("86.40") - charge_1) * 7 / 43_200
    autobid_charge(
        acme, market, "a2", (2 * target_2).quantize(NANO), at=NOON + timedelta(seconds=4)
    )
    step = autobidders_step_due(interval_s=10, now=NOON + timedelta(seconds=7))
    assert step.stepped == 2
    # Twice the 7-s target: gradient +1 again, log(1 + mu) = 2 eta. (Looking back a full 10 s
    # would have compared the charge with a 10-s target: gradient 2 x 7/10 - 1 = 0.4, 1.4 eta.)
    assert mus(acme) == [
        pytest.approx(math.expm1(ETA), abs=1e-9),
        pytest.approx(math.expm1(2 * ETA), abs=1e-9),
    ]
    last = AutobidderStep.objects.filter(autobidder__tenant=acme).latest("at")
    assert last.target == pytest.approx(target_2, abs=NANO)


@pytest.mark.django_db
def test_the_pacing_task_uses_the_configured_interval(settings) -> None:
    configure("acme")
    # A 1-hour interval: the second run, a moment later, is within half of it and skips.
    settings.AUTOBID_INTERVAL_S = 3600.0
    assert autobidders_step.apply().get() == {"stepped": 1, "skipped": 0, "failed": 0}
    assert autobidders_step.apply().get() == {"stepped": 0, "skipped": 1, "failed": 0}
    # A 1-ms interval: half of it has long passed by the next run, which steps again (with the
    # default 10 s, or the hour above, it would skip).
    settings.AUTOBID_INTERVAL_S = 0.001
    time.sleep(0.002)
    assert autobidders_step.apply().get() == {"stepped": 1, "skipped": 0, "failed": 0}


def test_the_previous_month() -> None:
    assert previous_month_bounds(now=datetime(2026, 1, 1, 0, 30, tzinfo=UTC)) == (
        datetime(2025, 12, 1, tzinfo=UTC),
        datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert previous_month_bounds(now=datetime(2026, 3, 31, 23, 59, tzinfo=UTC)) == (
        datetime(2026, 2, 1, tzinfo=UTC),
        datetime(2026, 3, 1, tzinfo=UTC),
    )


@pytest.mark.django_db
def test_invoices_for_the_previous_month_are_made_once() -> None:
    market = market_create()
    acme, globex = tenant_create("acme"), tenant_create("globex")
    late = tenant_create("late")  # signed up in November: no October invoice
    TenantModel.objects.filter(pk__in=[acme.pk, globex.pk]).update(
        created_at=datetime(2026, 9, 1, tzinfo=UTC)
    )
    TenantModel.objects.filter(pk=late.pk).update(created_at=datetime(2026, 11, 2, tzinfo=UTC))
    for tenant, rid, dollars, at in [
        (acme, "o1", 0.25, datetime(2026, 10, 1, tzinfo=UTC)),
        (acme, "o2", 0.125, datetime(2026, 10, 31, 23, 59, tzinfo=UTC)),
        (acme, "n1", 1.0, datetime(2026, 11, 1, tzinfo=UTC)),  # November
        (globex, "s1", 0.5, datetime(2026, 9, 30, 23, 59, tzinfo=UTC)),  # September
    ]:
        spend(tenant=tenant, market=market, request_id=rid, charge=dollars, at=at)

    now = datetime(2026, 11, 18, 0, 30, tzinfo=UTC)
    first = invoices_generate_previous_month(now=now)
    assert (first.created, first.existing, first.skipped) == (2, 0, 0)
    october = Invoice.objects.filter(period_start=datetime(2026, 10, 1, tzinfo=UTC))
    # acme: 0.25 + 0.125 in October (November's $1 is not in it); globex: nothing in October.
    assert dict(october.values_list("tenant__slug", "total")) == {
        "acme": Decimal("0.375"),
        "globex": Decimal("0"),
    }
    ids = sorted(october.values_list("id", flat=True))
    again = invoices_generate_previous_month(now=now + timedelta(days=1))
    assert (again.created, again.existing) == (0, 2)
    assert sorted(october.values_list("id", flat=True)) == ids


@pytest.mark.django_db
def test_the_invoice_task_is_idempotent() -> None:
    tenant_create("acme")
    TenantModel.objects.update(created_at=datetime(2020, 1, 1, tzinfo=UTC))
    first = invoices_generate.apply().get()
    second = invoices_generate.apply().get()
    assert (first["created"], second["created"], second["existing"]) == (1, 0, 1)
    assert Invoice.objects.count() == 1


@pytest.mark.celery_worker
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_steps_each_enabled_autobidder_once_per_interval(tmp_path: Path) -> None:
    configure("acme"), configure("globex"), configure("idle", enabled=False)
    interval = settings.AUTOBID_INTERVAL_S
    with celery_worker(tmp_path) as worker:
        runs = [
            autobidders_step.apply_async(kwargs={"interval_s": interval}, queue=worker.queue).get(
                timeout=60
            )
            for _ in range(2)
        ]
    assert runs == [
        {"stepped": 2, "skipped": 0, "failed": 0},
        {"stepped": 0, "skipped": 2, "failed": 0},  # within the same interval
    ]
    assert AutobidderStep.objects.count() == 2


def test_the_beat_schedule_names_registered_tasks() -> None:
    from config.celery import app

    app.loader.import_default_modules()
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert {entry["task"] for entry in schedule.values()} <= set(app.tasks)
    assert schedule["rounds-consume"]["schedule"] == 1.0
    # The documented rule (docs/configuration.md): AUTOBID_INTERVAL_S, 10 s when unset.
    assert schedule["autobidders-step"]["schedule"] == float(
        os.environ.get("AUTOBID_INTERVAL_S", "").strip() or "10"
    )
