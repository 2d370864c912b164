"""The ledger's writes as a plain reference: the ORM, in a transaction per write, with the money
rules computed in Python (``accounts.rules`` read with ``VALUES``). The ledger store's single
statements (``accounts.ledger``) are checked against it: :func:`reference_ledger_use` puts it
in the store's place, and the equivalence, concurrency and money-invariant tests run both.

Locks, in the same order everywhere so that two writers never deadlock: the request's row, its
hold's, the counter rows of its tenant and key (:func:`counters_locked`), the autobidder's.
Counter rows a write needs are created first (``budget_counters_ensure``), before anything is
locked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.db.models import F, Q

from accounts import ledger
from accounts.algebra import VALUES
from accounts.ledger.counters import budget_counters_ensure
from accounts.ledger.store import (
    BudgetExhausted,
    Open,
    Outcome,
    PriorityCharge,
    Settled,
    ToSettle,
    Usage,
)
from accounts.models import (
    ApiKey,
    Autobidder,
    BidSource,
    Budget,
    BudgetCounter,
    ChargeKind,
    Hold,
    HoldState,
    LedgerEntry,
    Request,
    RequestStatus,
    Tenant,
)
from accounts.money import ZERO, PostedPrices, money_str, prices_of
from accounts.rules import left, settlement
from accounts.selectors.budgets import budget_usage_counted
from accounts.windows import window_for


def reference_ledger_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the services write through :class:`ReferenceLedger` instead of the ledger store
    (until the test ends)."""
    monkeypatch.setattr(ledger, "_LEDGER", ReferenceLedger())


@dataclass(frozen=True)
class Allowed:
    """A charge as it may be written (dollars) and, when less than asked, what capped it."""

    amount: Decimal
    capped_by: str | None  # rules.PRIORITY_CAP, BUDGET, AUTOBIDDER_BUDGET, or None: not capped


def settlement_allowed(**operands: Any) -> tuple[Allowed, Allowed | None]:
    """``rules.settlement`` computed: what a settlement may write of the token charge and of
    the priority charge (None: the engine reported none)."""
    taken, tokens_cut, paid, priority_cut = settlement(VALUES, **operands)
    priority = None if paid is None else Allowed(amount=paid, capped_by=priority_cut)
    return Allowed(amount=taken, capped_by=tokens_cut), priority


def capped_detail(detail: dict[str, Any], *, allowed: Allowed, asked: Decimal) -> dict[str, Any]:
    """An entry's detail with what a cap cut, when one did (amounts as exact strings)."""
    if allowed.capped_by is None:
        return detail
    return {
        **detail,
        "capped_at": money_str(allowed.amount),
        "capped_by": allowed.capped_by,
        "uncapped": money_str(asked),
    }


def counters_locked(*, tenant_id: int, api_key_id: int | None) -> list[BudgetCounter]:
    """Lock and return the counter rows of a tenant and of its key (if any), the tenant's first.
    Call inside ``transaction.atomic``."""
    return list(
        BudgetCounter.objects.select_for_update()
        .filter(Q(api_key__isnull=True) | Q(api_key_id=api_key_id), tenant_id=tenant_id)
        .order_by(F("api_key_id").asc(nulls_first=True))
    )


def counters_saved(counters: list[BudgetCounter]) -> None:
    """Save what changed in locked counter rows."""
    for counter in counters:
        counter.save(
            update_fields=[
                "held", "spent_total", "day_start", "day_spent", "week_start", "week_spent",
                "month_start", "month_spent",
            ]
        )  # fmt: skip


def budget_room(
    *, tenant_id: int, api_key_id: int | None, counters: list[BudgetCounter], now: datetime
) -> Decimal | None:
    """The least, over the budgets that apply to a request of (tenant, key), of limit - spent
    in the window at ``now`` - held, dollars, from their ``counters`` (locked by the caller);
    None when no budget applies. A window newer than ``now``'s (the caller's clock is behind
    the row's) reads the row's window: the most it can have spent."""
    by_scope = {c.api_key_id: c for c in counters}
    budgets = Budget.objects.filter(
        Q(api_key__isnull=True) | Q(api_key_id=api_key_id), tenant_id=tenant_id
    )
    rooms = []
    for budget in budgets:
        counter = by_scope[budget.api_key_id]
        start = window_for(period=budget.period, now=now).start
        spent = counter.spent_in(period=budget.period, window_start=start, at_most=True)
        rooms.append(left(VALUES, limit=budget.limit, spent=spent, held=counter.held))
    return min(rooms, default=None)


class ReferenceLedger:
    """The ledger store's writes with the ORM (the same interface as
    ``accounts.ledger.postgres.PostgresLedger``)."""

    @transaction.atomic
    def request_open(
        self,
        *,
        tenant: Tenant,
        api_key: ApiKey | None,
        request_id: str,
        amount: Decimal,
        now: datetime,
        fields: dict[str, Any],
    ) -> Request:
        """:meth:`hold_place` and the request's row together; a replay returns the row."""
        self._hold(tenant=tenant, api_key=api_key, request_id=request_id, amount=amount, now=now)
        request, _ = Request.objects.get_or_create(
            request_id=request_id,
            defaults={"tenant": tenant, "api_key": api_key, "created_at": now, **fields},
        )
        return request

    def requests_open(self, *, opens: Sequence[Open], now: datetime) -> list[Request | Exception]:
        """:meth:`request_open` of each, one after another: its row, or why it was not
        opened."""
        results: list[Request | Exception] = []
        for o in opens:
            try:
                results.append(
                    self.request_open(
                        tenant=o.tenant,
                        api_key=o.api_key,
                        request_id=o.request_id,
                        amount=o.amount,
                        now=now,
                        fields=o.fields,
                    )  # fmt: skip
                )
            except (BudgetExhausted, ValueError) as exc:
                results.append(exc)
        return results

    def _hold(
        self,
        *,
        tenant: Tenant,
        api_key: ApiKey | None,
        request_id: str,
        amount: Decimal,
        now: datetime,
    ) -> Hold:
        """Reserve ``amount`` against every budget that applies (BudgetExhausted, nothing
        written, when it does not fit); a replay returns the first hold. As ``_hold``: inside
        ``transaction.atomic``, first; as ``hold_place``: in a transaction of its own."""
        api_key_id = api_key.pk if api_key else None
        budget_counters_ensure(tenant_id=tenant.pk, api_key_id=api_key_id, now=now)
        counters = counters_locked(tenant_id=tenant.pk, api_key_id=api_key_id)
        existing = Hold.objects.filter(request_id=request_id).first()
        if existing is not None:
            if existing.tenant_id != tenant.pk or existing.api_key_id != api_key_id:
                raise ValueError(f"request {request_id!r} is held for another tenant or key")
            return existing
        by_scope = {c.api_key_id: c for c in counters}
        budgets = Budget.objects.filter(
            Q(api_key__isnull=True) | Q(api_key_id=api_key_id), tenant=tenant
        ).order_by("id")
        for budget in budgets:
            status = budget_usage_counted(
                budget=budget, counter=by_scope[budget.api_key_id], now=now
            )
            if not status.fits(amount):
                raise BudgetExhausted(status=status, amount=amount)
        hold = Hold.objects.create(
            request_id=request_id,
            tenant=tenant,
            api_key=api_key,
            amount=amount,
            remaining=amount,
            created_at=now,
        )
        for counter in counters:
            counter.held += amount
        counters_saved(counters)
        return hold

    hold_place = transaction.atomic(_hold)

    def request_settle(
        self,
        *,
        request_id: str,
        usage: Usage,
        tokens: Decimal,
        priority: PriorityCharge | None,
        prices: PostedPrices,
        now: datetime,
    ) -> Settled:
        """Settle a served request once: both its entries, each at most what the money rules
        allow, its hold closed, both counted, with the request locked; REPRICED when
        ``prices`` are no longer its market's."""
        owner = Request.objects.filter(request_id=request_id).values("tenant_id", "api_key_id")
        scope = owner.first()
        if scope is None:
            return Settled(Outcome.UNKNOWN)
        with transaction.atomic():
            budget_counters_ensure(**scope, now=now)
            # Lock order everywhere: the request, its hold, the counters, the autobidder.
            request = Request.objects.select_for_update().get(pk=request_id)
            if request.status == RequestStatus.FAILED:
                return Settled(Outcome.NOT_SERVED)
            if request.status == RequestStatus.SERVED:
                return Settled(Outcome.DUPLICATE)
            if prices_of(request.market) != prices_of(prices):
                return Settled(Outcome.REPRICED)
            hold = (
                Hold.objects.select_for_update()
                .filter(request_id=request_id, state=HoldState.OPEN)
                .first()
            )
            counters = counters_locked(**scope)
            autobidder = None
            if priority is not None and request.bid_source == BidSource.AUTOBID:
                locked = Autobidder.objects.select_for_update()
                autobidder = locked.filter(tenant_id=scope["tenant_id"]).first()
            remaining = hold.remaining if hold is not None else ZERO
            allowed_tokens, allowed_priority = settlement_allowed(
                tokens=tokens,
                priority=None if priority is None else priority.amount,
                priority_cap=request.priority_cap,
                hold_remaining=remaining,
                budget_room=budget_room(**scope, counters=counters, now=now),
                autobidder_room=None if autobidder is None else autobidder.budget_left(now=now),
            )
            entry = {**scope, "request_id": request_id, "market_id": request.market_id}
            written = LedgerEntry.objects.create(
                **entry,
                kind=ChargeKind.TOKENS,
                round_id="",
                amount=allowed_tokens.amount,
                detail=capped_detail(usage.tokens_detail(), allowed=allowed_tokens, asked=tokens),
                created_at=now,
            )
            charged = allowed_tokens.amount
            priority_entry = None
            if priority is not None and allowed_priority is not None:
                priority_entry = LedgerEntry.objects.create(
                    **entry,
                    kind=ChargeKind.PRIORITY,
                    round_id=priority.round_id,
                    amount=allowed_priority.amount,
                    detail=capped_detail(
                        priority.detail, allowed=allowed_priority, asked=priority.amount
                    ),
                    created_at=now,
                )
                charged += allowed_priority.amount
            Request.objects.filter(pk=request_id).update(
                status=RequestStatus.SERVED,
                finished_at=now,
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=usage.cached_tokens,
                completion_tokens=usage.completion_tokens,
                ttft_s=usage.ttft_s,
                e2e_s=usage.e2e_s,
            )
            if hold is not None:
                hold.state, hold.remaining, hold.closed_at = HoldState.SETTLED, ZERO, now
                hold.save(update_fields=["remaining", "state", "closed_at"])
            for counter in counters:
                counter.charge_counted(amount=charged, at=now)
                counter.held -= remaining
            counters_saved(counters)
            if autobidder is not None and priority_entry is not None:
                autobidder.charge_counted(amount=priority_entry.amount, at=now)
                autobidder.save(update_fields=["spent_start", "spent_in_window"])
        return Settled(Outcome.WRITTEN, written, priority_entry)

    def requests_settle(self, *, asks: Sequence[ToSettle], now: datetime) -> list[Settled]:
        """Each of ``asks`` settled by :meth:`request_settle`, one after another."""
        return [
            self.request_settle(
                request_id=ask.request_id,
                usage=ask.usage,
                tokens=ask.tokens,
                priority=ask.priority,
                prices=ask.prices,
                now=now,
            )
            for ask in asks
        ]

    def hold_close(self, *, request_id: str, now: datetime, fail_request: bool) -> bool:
        """Release the request's open hold, nothing charged; ``fail_request``: also mark the
        request failed if it is still queued. Returns whether the request failed now
        (``fail_request``, or no request row: whether a hold was released), else whether a
        hold was released."""
        owner = (
            Request.objects.filter(request_id=request_id).values("tenant_id", "api_key_id").first()
            if fail_request
            else None
        )
        if owner is None:
            hold = Hold.objects.filter(request_id=request_id).first()
            if hold is None:
                return False
            with transaction.atomic():
                budget_counters_ensure(
                    tenant_id=hold.tenant_id, api_key_id=hold.api_key_id, now=now
                )
                return self._released(request_id=request_id, now=now)
        with transaction.atomic():
            budget_counters_ensure(**owner, now=now)
            # Lock order everywhere: the request, then its hold, then the counters.
            Request.objects.select_for_update().filter(request_id=request_id).exists()
            failed = Request.objects.filter(
                request_id=request_id, status=RequestStatus.QUEUED
            ).update(status=RequestStatus.FAILED, finished_at=now)
            self._released(request_id=request_id, now=now)
        return failed == 1

    def _released(self, *, request_id: str, now: datetime) -> bool:
        """Release the open hold: inside ``transaction.atomic``, with the hold's counter rows
        ensured and the request (if any) locked. Whether there was one to release."""
        hold = Hold.objects.select_for_update().filter(request_id=request_id).first()
        if hold is None or hold.state != HoldState.OPEN:
            return False
        counters = counters_locked(tenant_id=hold.tenant_id, api_key_id=hold.api_key_id)
        for counter in counters:
            counter.held -= hold.remaining
        counters_saved(counters)
        hold.state, hold.remaining, hold.closed_at = HoldState.RELEASED, ZERO, now
        hold.save(update_fields=["remaining", "state", "closed_at"])
        return True

    def posted_prices(self, *, request_id: str) -> PostedPrices | None:
        """The request's market's prices now; None when there is no such request."""
        request = Request.objects.select_related("market").filter(request_id=request_id).first()
        return None if request is None else request.market
