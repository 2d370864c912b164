"""The demo's past: a closed month of traffic for each demo tenant, and its invoice.

``seed_demo`` runs on every ``make run``, and the console should show an invoice on first look;
the current month cannot have one (it is not over). So a demo tenant without any invoice gets
the previous UTC month's traffic, written through the ledger's own services as the gateway
writes it (:func:`request_open` holds, :func:`request_settle` charges the tokens and the
priority charge the engine reported), then that month's invoice (:func:`invoice_generate`).

Deterministic (fixed request ids, days and a fixed random seed per tenant) and idempotent: a
tenant with an invoice is left alone; a month that already has ledger entries of the tenant
(real traffic, or a run stopped before its invoice) is invoiced as it is, not seeded again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from django.db import transaction
from django.utils import timezone

from accounts.ledger import PriorityCharge
from accounts.models import ApiKey, Invoice, LedgerEntry, Tenant
from accounts.money import PostedPrices, money
from accounts.services.invoices import invoice_generate, previous_month_bounds
from accounts.services.keys import api_key_create
from accounts.services.settlement import request_open, request_settle
from accounts.services.tenants import DEMO_TENANTS

# The days of the month with traffic (every month has them), and the keys it came through: a
# modest month (13 requests a tenant), so that the first `make run` stays quick.
DEMO_DAYS = (3, 8, 14, 19, 25)
WEB_KEY, BATCH_KEY = "web-app", "nightly-batch"
HOLD = "0.50"  # dollars held per request: far above any demo charge, far below the budget
ENGINE = "demo-history"


class DemoMarket(PostedPrices, Protocol):
    """The market the demo's past traffic went to (``market.models.Market`` is one)."""

    slug: str


@dataclass(frozen=True)
class DemoRequest:
    """One request of the demo's past: who sent it, when, its bid, charge and tokens."""

    request_id: str
    api_key: ApiKey | None
    at: datetime
    bid: float  # dollars per second of waiting
    priority: float  # the round's charge, dollars (an engine's float)
    prompt_tokens: int  # all of them
    cached_tokens: int  # of which cached
    completion_tokens: int


def demo_requests(
    *, tenant: Tenant, keys: dict[str, ApiKey], month_start: datetime
) -> list[DemoRequest]:
    """The tenant's requests of the month starting at ``month_start``: on each of
    :data:`DEMO_DAYS`, an interactive request through the web app's key (a bid, a priority
    charge) and a batch request through the nightly batch's key (no bid: a priority charge of 0),
    and on odd days one more sent from the console (no key, a bid)."""
    rng = random.Random(f"demo-history:{tenant.slug}")
    requests = []
    for day in DEMO_DAYS:
        midnight = month_start + timedelta(days=day - 1)
        batch_prompt = rng.randrange(8_000, 24_000)
        plan = [
            (keys[BATCH_KEY], timedelta(hours=2), "batch"),
            (keys[WEB_KEY], timedelta(hours=rng.randrange(8, 12)), "interactive"),
        ]
        if day % 2:
            plan.append((None, timedelta(hours=rng.randrange(13, 19)), "interactive"))
        for api_key, offset, kind in plan:
            at = midnight + offset + timedelta(minutes=rng.randrange(60))
            if kind == "batch":
                prompt = batch_prompt
                cached = prompt * 3 // 4
                completion = rng.randrange(500, 2_000)
                bid = priority = 0.0
            else:
                prompt = rng.randrange(600, 4_000)
                cached = rng.randrange(0, prompt // 2)
                completion = rng.randrange(80, 600)
                bid = 0.05
                priority = round(rng.uniform(0.02, 0.15), 6)
            requests.append(
                DemoRequest(
                    request_id=f"demo-{tenant.slug}-{at:%Y%m%d-%H%M}-{len(requests):03d}",
                    api_key=api_key,
                    at=at,
                    bid=bid,
                    priority=priority,
                    prompt_tokens=prompt,
                    cached_tokens=cached,
                    completion_tokens=completion,
                )
            )
    return requests


def _priority_charge(request: DemoRequest) -> PriorityCharge:
    """The priority charge the engine reported for ``request``, with its round's view of it."""
    return PriorityCharge(
        amount=money(request.priority),
        round_id=f"{ENGINE}:{request.at:%Y%m}:{request.request_id}",
        detail={
            "bid": request.bid,
            "effective_bid": request.bid,
            "time_saved_s": round(request.priority / request.bid, 3) if request.bid else 0.0,
            "planned_completion_s": 0.4,
            "position": 0,
            "engine_charge": request.priority,
            "block": {
                "prefix_tokens": request.cached_tokens,
                "requests": 1,
                "bid_mean": request.bid,
                "density": 0.0,
            },
            "engine": ENGINE,
        },
    )


def _keys_ensure(*, tenant: Tenant, created_at: datetime) -> dict[str, ApiKey]:
    """The tenant's demo keys, by name, created (as of ``created_at``) where missing. Their
    secrets are not kept: they only stand for the past month's programs."""
    keys = {}
    for name in (WEB_KEY, BATCH_KEY):
        key = ApiKey.objects.filter(tenant=tenant, name=name).order_by("id").first()
        if key is None:
            key, _ = api_key_create(tenant=tenant, name=name, created_by=None, now=created_at)
        keys[name] = key
    return keys


def _month_seed(*, tenant: Tenant, market: DemoMarket, start: datetime) -> None:
    keys = _keys_ensure(tenant=tenant, created_at=start)
    for request in demo_requests(tenant=tenant, keys=keys, month_start=start):
        request_open(
            request_id=request.request_id,
            tenant=tenant,
            api_key=request.api_key,
            market=market,
            bid=request.bid,
            hold_amount=HOLD,
            request_class="background" if request.api_key == keys[BATCH_KEY] else "interactive",
            bid_source="explicit" if request.bid else "none",
            now=request.at,
        )
        request_settle(
            request_id=request.request_id,
            prompt_tokens=request.prompt_tokens,
            cached_tokens=request.cached_tokens,
            completion_tokens=request.completion_tokens,
            ttft_s=0.4,
            e2e_s=2.5,
            priority=_priority_charge(request),
            now=request.at + timedelta(seconds=2.5),
            market=market,
        )


def demo_history_seed(*, market: DemoMarket, now: datetime | None = None) -> list[Invoice]:
    """Give each demo tenant without an invoice the previous month's traffic and its invoice;
    returns each demo tenant's latest invoice. Idempotent (see the module's docstring)."""
    now = now or timezone.now()
    start, end = previous_month_bounds(now=now)
    latest = []
    for _name, slug, _login in DEMO_TENANTS:
        tenant = Tenant.objects.get(slug=slug)
        invoice = Invoice.objects.filter(tenant=tenant).order_by("-period_start").first()
        if invoice is None:
            with transaction.atomic():
                in_month = LedgerEntry.objects.filter(
                    tenant=tenant, created_at__gte=start, created_at__lt=end
                )
                if not in_month.exists():
                    _month_seed(tenant=tenant, market=market, start=start)
                invoice = invoice_generate(
                    tenant=tenant, period_start=start, period_end=end, now=now
                )
        latest.append(invoice)
    return latest
