"""The ledger store on PostgreSQL: each write one statement (``accounts.ledger.statements``),
the reference (:class:`~accounts.ledger.orm.OrmLedger`) where a statement declines."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from decimal import Decimal
from typing import Any

from accounts.ledger import statements
from accounts.ledger.orm import OrmLedger
from accounts.ledger.store import BudgetExhausted, Outcome, PriorityCharge, Settled, Usage
from accounts.models import (
    ApiKey,
    Budget,
    ChargeKind,
    Hold,
    HoldState,
    LedgerEntry,
    Request,
    RequestStatus,
    Tenant,
)
from accounts.money import PostedPrices, prices_of
from accounts.rules import BUDGET, VALUES, Allowed, capped_detail, fits
from accounts.selectors.budgets import BudgetStatus, budget_status_of
from accounts.windows import window_for

# A request's fields that only its settlement fills in (None in a row the statement wrote).
_UNSET_AT_OPEN = (
    "finished_at",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "ttft_s",
    "e2e_s",
)


class PostgresLedger(OrmLedger):
    """The ledger's writes in single statements, with the reference behind."""

    def hold_place(
        self,
        *,
        tenant: Tenant,
        api_key: ApiKey | None,
        request_id: str,
        amount: Decimal,
        now: datetime,
    ) -> Hold:
        placed = self._placed(
            tenant=tenant, api_key=api_key, request_id=request_id, amount=amount, now=now
        )
        if placed is None:
            return super().hold_place(
                tenant=tenant, api_key=api_key, request_id=request_id, amount=amount, now=now
            )
        return statements.model_loaded(
            Hold,
            {
                "id": placed.hold_id,
                "request_id": request_id,
                "tenant_id": tenant.pk,
                "api_key_id": api_key.pk if api_key else None,
                "amount": amount,
                "remaining": amount,
                "state": HoldState.OPEN,
                "created_at": now,
                "closed_at": None,
            },
        )

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
        request = {
            "market": fields["market_id"],
            **{k: v for k, v in fields.items() if k != "market_id"},
        }
        placed = self._placed(
            tenant=tenant,
            api_key=api_key,
            request_id=request_id,
            amount=amount,
            now=now,
            request=request,
        )
        if placed is not None and placed.request_created:
            return statements.model_loaded(
                Request,
                {
                    "request_id": request_id,
                    "tenant_id": tenant.pk,
                    "api_key_id": api_key.pk if api_key else None,
                    "status": RequestStatus.QUEUED,
                    "created_at": now,
                    **dict.fromkeys(_UNSET_AT_OPEN),
                    **fields,
                },
            )
        if placed is not None:  # the hold is new but the request's row was there already
            return Request.objects.get(request_id=request_id)
        return super().request_open(
            tenant=tenant,
            api_key=api_key,
            request_id=request_id,
            amount=amount,
            now=now,
            fields=fields,
        )

    def _placed(
        self,
        *,
        tenant: Tenant,
        api_key: ApiKey | None,
        request_id: str,
        amount: Decimal,
        now: datetime,
        request: dict[str, object] | None = None,
    ) -> statements.HoldOutcome | None:
        """The hold statement, with the request's row when ``request`` is given: what it did
        when it placed the hold, BudgetExhausted when a budget refused it, else None: the
        reference decides (the statement declined, or the request already has a hold)."""
        fast = statements.hold_place(
            tenant_id=tenant.pk,
            api_key_id=api_key.pk if api_key else None,
            request_id=request_id,
            amount=amount,
            now=now,
            request=request,
        )
        if fast.hold_id is not None:
            return fast
        if not fast.counted or fast.fits:
            return None  # declined, or a hold is already there
        if Hold.objects.filter(request_id=request_id).exists():
            return None  # a replay: the first hold is returned, whatever the budget says now
        raise BudgetExhausted(status=_refusal(fast.budgets, amount=amount, now=now), amount=amount)

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
        fast = statements.request_settle(
            request_id=request_id,
            usage=asdict(usage),
            tokens=tokens,
            priority=None if priority is None else priority.amount,
            round_id="" if priority is None else priority.round_id,
            priority_detail=None if priority is None else priority.detail,
            prices=prices_of(prices),
            now=now,
        )
        if fast.status is None:
            return Settled(Outcome.UNKNOWN)
        if fast.status == RequestStatus.FAILED:
            return Settled(Outcome.NOT_SERVED)
        if fast.status == RequestStatus.SERVED:
            return Settled(Outcome.DUPLICATE)
        if fast.tokens_id is None:
            if not fast.priced:
                return Settled(Outcome.REPRICED)
            return super().request_settle(  # declined: the reference decides
                request_id=request_id,
                usage=usage,
                tokens=tokens,
                priority=priority,
                prices=prices,
                now=now,
            )
        owner = {
            "request_id": request_id,
            "tenant_id": fast.tenant_id,
            "api_key_id": fast.api_key_id,
            "market_id": fast.market_id,
            "created_at": now,
        }
        token_entry = _entry_loaded(
            owner,
            entry_id=fast.tokens_id,
            kind=ChargeKind.TOKENS,
            round_id="",
            asked=tokens,
            allowed=Allowed(
                amount=fast.tokens_amount,
                capped_by=None if fast.tokens_amount >= tokens else BUDGET,
            ),
            detail=usage.tokens_detail(),
        )
        priority_entry = None
        if priority is not None and fast.priority_id is not None:
            priority_entry = _entry_loaded(
                owner,
                entry_id=fast.priority_id,
                kind=ChargeKind.PRIORITY,
                round_id=priority.round_id,
                asked=priority.amount,
                allowed=Allowed(amount=fast.priority_amount, capped_by=fast.priority_capped_by),
                detail=priority.detail,
            )
        return Settled(Outcome.WRITTEN, token_entry, priority_entry)

    def hold_close(self, *, request_id: str, now: datetime, fail_request: bool) -> bool:
        fast = statements.hold_close(request_id=request_id, now=now, fail_request=fail_request)
        if fast.counted:
            if fail_request and fast.request_found:
                return fast.failed
            return fast.released
        return super().hold_close(request_id=request_id, now=now, fail_request=fail_request)

    def posted_prices(self, *, request_id: str) -> PostedPrices | None:
        return statements.request_prices(request_id=request_id)


def _entry_loaded(
    owner: dict[str, Any],
    *,
    entry_id: int,
    kind: str,
    round_id: str,
    asked: Decimal,
    allowed: Allowed,
    detail: dict[str, Any],
) -> LedgerEntry:
    """The entry the settle statement wrote, from what it was given and what it returned."""
    return statements.model_loaded(
        LedgerEntry,
        {
            **owner,
            "id": entry_id,
            "kind": kind,
            "round_id": round_id,
            "amount": allowed.amount,
            "detail": capped_detail(detail, allowed=allowed, asked=asked),
        },
    )


def _refusal(rows: list[statements.BudgetRow], *, amount: Decimal, now: datetime) -> BudgetStatus:
    """The status of the first budget, in id order, that the hold statement found too full."""
    row = next(
        r
        for r in rows
        if not fits(VALUES, limit=r.limit, spent=r.spent, held=r.held, amount=amount)
    )
    budget = Budget(
        id=row.budget_id,
        api_key_id=row.api_key_id,
        period=row.period,
        limit=row.limit,
        soft_alert_fraction=row.soft_alert_fraction,
    )
    window = window_for(period=row.period, now=now)
    return budget_status_of(budget=budget, spent=row.spent, held=row.held, window=window, now=now)
