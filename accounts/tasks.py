"""The accounts' Celery tasks, thin wrappers over ``accounts.services`` that celery beat drives
(``CELERY_BEAT_SCHEDULE`` in ``config.settings``): ``autobidders_step`` every
``AUTOBID_INTERVAL_S`` seconds, ``gateways_sweep`` every 5 s, ``holds_sweep`` every minute,
``invoices_generate`` daily."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from celery import Task, shared_task
from django.conf import settings

from accounts.services import gateways, periodic, settlement


@shared_task(bind=True, name="accounts.autobidders_step", acks_late=True)
def autobidders_step(self: Task, *, interval_s: float | None = None) -> dict[str, Any]:
    """One pacing step for each enabled autobidder that is due (beat: every AUTOBID_INTERVAL_S)."""
    interval = interval_s if interval_s is not None else settings.AUTOBID_INTERVAL_S
    return asdict(periodic.autobidders_step_due(interval_s=interval))


@shared_task(name="accounts.holds_sweep", ignore_result=True)
def holds_sweep() -> dict[str, Any]:
    """Close what a lost gateway left open: requests still queued long after any request is
    served, failed uncharged (beat: every minute)."""
    return asdict(settlement.holds_sweep(stale_after_s=settings.STALE_REQUEST_S))


@shared_task(name="accounts.gateways_sweep", ignore_result=True)
def gateways_sweep() -> dict[str, Any]:
    """Close what a gateway process that stopped beating left open: its requests still queued,
    failed uncharged (beat: every ``gateways.SWEEP_S`` seconds)."""
    return asdict(gateways.lost_gateways_sweep())


@shared_task(bind=True, name="accounts.invoices_generate", acks_late=True)
def invoices_generate(self: Task) -> dict[str, Any]:
    """The previous UTC month's invoices where missing (beat: daily)."""
    return asdict(periodic.invoices_generate_previous_month())
