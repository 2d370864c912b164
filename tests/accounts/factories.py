"""Test data for the accounts tests: tenants, users with roles, a market, round records.

Every amount here is written out by hand; tests compute expected values by hand, never from the
code under test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django.db import connection

from accounts.ledger import PriorityCharge
from accounts.models import Membership, Role, Tenant
from accounts.money import money
from engines.contract.records import SCHEMA
from market.models import Market

# A Wednesday afternoon. Its day starts 2026-11-18 00:00, its week Monday 2026-11-16, its month
# 2026-11-01 (all UTC).
NOW = datetime(2026, 11, 18, 15, 30, tzinfo=UTC)
MIDNIGHT = datetime(2026, 11, 19, tzinfo=UTC)  # the end of NOW's day; the same week and month
PASSWORD = "persona-pass-123"


def market_create(slug: str = "test-llm") -> Market:
    """$3 per million uncached input tokens, $0.30 cached, $15 output; no reserve."""
    return Market.objects.create(
        slug=slug,
        name=f"Market {slug}",
        served_model=f"org/{slug}",
        price_input_per_mtok=Decimal("3"),
        price_cached_input_per_mtok=Decimal("0.3"),
        price_output_per_mtok=Decimal("15"),
        reserve=Decimal("0"),
    )


def tenant_create(slug: str) -> Tenant:
    return Tenant.objects.create(name=f"Tenant {slug.upper()}", slug=slug)


def user_create(
    username: str, *, tenant: Tenant | None = None, role: str | None = None, staff: bool = False
) -> AbstractUser:
    user = get_user_model().objects.create_user(
        username=username, password=PASSWORD, is_staff=staff
    )
    if tenant is not None:
        Membership.objects.create(tenant=tenant, user=user, role=role or Role.VIEWER)
    return user


def admitted(request_id: str, charge: float, *, bid: float = 0.5, position: int = 0) -> dict:
    """One admitted request of a round record (the engines' schema)."""
    return {
        "request_id": request_id,
        "bid": bid,
        "effective_bid": bid,
        "position": position,
        "planned_completion_s": 0.25,
        "time_saved_s": 0.125,
        "charge": charge,
        "prompt_tokens": 1200,
        "cached_tokens": 1000,
        "block": {"prefix_tokens": 1000, "requests": 4, "bid_mean": bid, "density": 0.002},
    }


def round_record(
    round_id: str, admitted_requests: list[dict], *, market: str = "test-llm", seq: int = 1
) -> dict[str, Any]:
    """A valid round record (``engines.contract.records``) admitting
    ``admitted_requests``."""
    return {
        "schema": SCHEMA,
        "engine": "sim",
        "market": market,
        "epoch": "e1",
        "round_id": round_id,
        "seq": seq,
        "time": 1000.0 + seq,
        "policy": "dfs-auction-density",
        "reserve": 0.0,
        "tokens_per_second": 10000.0,
        "waiting": len(admitted_requests) + 3,
        "subtrees": [],
        "admitted": admitted_requests,
    }


def spend(
    *,
    tenant: Tenant,
    market: Market,
    request_id: str,
    charge: float,
    at: datetime,
    api_key: Any = None,
) -> None:
    """Make ``tenant`` spend ``charge`` dollars at ``at``: a request is opened (holding the
    charge) and settled with the priority charge its engine reported, and no tokens."""
    from accounts.services import request_open, request_settle

    request_open(
        request_id=request_id,
        tenant=tenant,
        api_key=api_key,
        market=market,
        bid="1",
        hold_amount=charge,
        now=at,
    )
    request_settle(
        request_id=request_id,
        prompt_tokens=0,
        cached_tokens=0,
        completion_tokens=0,
        priority=priority_charge(charge, round_id=f"r-{request_id}"),
        now=at,
    )


def counters_mismatches(tenant: Tenant) -> list[str]:
    """How the budget counter rows of ``tenant`` (its own and its keys') differ from sums of its
    ledger entries and open holds, worked out here one by one; [] when they agree."""
    from accounts.models import BudgetCounter, Hold, HoldState, LedgerEntry
    from accounts.windows import window_for

    entries = list(
        LedgerEntry.objects.filter(tenant=tenant).values_list("api_key_id", "amount", "created_at")
    )
    holds = list(
        Hold.objects.filter(tenant=tenant, state=HoldState.OPEN).values_list(
            "api_key_id", "remaining"
        )
    )
    mismatches = []
    for counter in BudgetCounter.objects.filter(tenant=tenant):
        key = counter.api_key_id
        mine = [(amount, at) for k, amount, at in entries if key is None or k == key]
        expected = {
            "held": sum((r for k, r in holds if key is None or k == key), Decimal(0)),
            "spent_total": sum((amount for amount, _ in mine), Decimal(0)),
        }
        for period in ("day", "week", "month"):
            start = getattr(counter, f"{period}_start")
            end = window_for(period=period, now=start).end
            expected[f"{period}_spent"] = sum(
                (a for a, at in mine if start <= at < end), Decimal(0)
            )
            newer = [at for _, at in mine if at >= end]
            if newer:
                mismatches.append(f"key {key}: {period} window {start} but spend at {newer}")
        for name, value in expected.items():
            if getattr(counter, name) != value:
                mismatches.append(f"key {key}: {name} {getattr(counter, name)} != {value}")
    return mismatches


THREADS = 40  # each with its own connection; PostgreSQL's default max_connections is 100


def run_concurrently(jobs: list[Callable[[], object]]) -> list[object]:
    """Run ``jobs`` on THREADS threads that start together; each thread closes its connection.
    Returns each job's result, or the exception it raised."""
    barrier = threading.Barrier(THREADS)
    chunks = [jobs[i::THREADS] for i in range(THREADS)]

    def worker(chunk: list[Callable[[], object]]) -> list[object]:
        results: list[object] = []
        try:
            barrier.wait(timeout=60)
            for job in chunk:
                try:
                    results.append(job())
                except Exception as exc:  # collected and checked by the test
                    results.append(exc)
        finally:
            connection.close()
        return results

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        return [r for chunk_results in pool.map(worker, chunks) for r in chunk_results]


def priority_charge(
    charge: float | str, *, round_id: str = "sim:e1:1", bid: float = 0.5, position: int = 0
) -> PriorityCharge:
    """The priority charge an engine reports in its answer for a request it admitted (what the
    gateway settles), with the round's view of the request (the engines' fields)."""
    return PriorityCharge(
        amount=money(charge),
        round_id=round_id,
        detail={
            "bid": bid,
            "effective_bid": bid,
            "time_saved_s": 0.125,
            "planned_completion_s": 0.25,
            "position": position,
            "engine_charge": float(charge),
            "block": {"prefix_tokens": 1000, "requests": 4, "bid_mean": bid, "density": 0.002},
            "engine": "sim",
        },
    )


def decided_first_then_rest(first, rest) -> list:  # type: ignore[no-untyped-def]
    """A batch written as the gateway writes it (``batching.decided_first``), on Django's
    connection: the ``first`` statement run, then ``rest(indices)`` for the requests it left
    undecided, each result in its place."""
    results = first.run()
    undecided = [k for k, r in enumerate(results) if r is None]
    for k, result in zip(undecided, rest(undecided), strict=True):
        results[k] = result
    return results
