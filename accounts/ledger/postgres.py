"""The ledger store: each write one statement (``accounts.ledger.statements``), and the few
steps a statement needs first when it declines (counter rows created, or locked)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction

from accounts.ledger import statements
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


class PostgresLedger:
    """The ledger's writes, a two-phase transfer per request: open a request with its hold (or
    place a hold alone), settle it (both its charges, the hold closed), or close its hold
    unsettled. Amounts in dollars (``Decimal``, 9 places); ``now`` is the write's time, which
    decides the budget windows it counts in."""

    def hold_place(
        self,
        *,
        tenant: Tenant,
        api_key: ApiKey | None,
        request_id: str,
        amount: Decimal,
        now: datetime,
    ) -> Hold:
        """Reserve ``amount`` against every budget that applies (BudgetExhausted, nothing
        written, when it does not fit); a replay returns the first hold."""
        ask = statements.HoldAsk(request_id, tenant.pk, api_key.pk if api_key else None, amount)
        placed = self._holds_placed(asks=[ask], now=now)[0]
        if isinstance(placed, Exception):
            raise placed
        return placed[0]

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
        """:meth:`requests_open` of one (BudgetExhausted, ValueError: raised)."""
        opened = self.requests_open(
            opens=[Open(tenant, api_key, request_id, amount, fields)], now=now
        )[0]
        if isinstance(opened, Exception):
            raise opened
        return opened

    def requests_open(self, *, opens: Sequence[Open], now: datetime) -> list[Request | Exception]:
        """Hold each request's amount and record the request (``fields``: its market_id, bid,
        ...), as if one after another in the order of ``opens``: each one's row, or why it was
        not opened (BudgetExhausted when a budget refused it, ValueError when the request is
        held for another tenant or key); a replay returns the row as it is."""
        results: list[Request | Exception] = []
        for o, placed in zip(
            opens, self._holds_placed(asks=_hold_asks(opens), now=now), strict=True
        ):
            if isinstance(placed, Exception):
                results.append(placed)
            elif placed[1]:  # its row was written with the hold
                results.append(_opened(o, now=now))
            else:  # a replay, or a hold for a request id held alone (``hold_place``) first
                owner = {
                    "tenant_id": o.tenant.pk,
                    "api_key_id": o.api_key.pk if o.api_key else None,
                }
                row, _ = Request.objects.get_or_create(
                    request_id=o.request_id, defaults={**owner, "created_at": now, **o.fields}
                )
                results.append(row)
        return results

    def requests_open_first(
        self, *, opens: Sequence[Open], now: datetime
    ) -> statements.Statement[list[Request | None]]:
        """The first statement of :meth:`requests_open`, to run on any connection (in a
        transaction of its own): each request's row where it opened the request (its hold
        placed and its row written with it, as for nearly every request); None where it wrote
        nothing (a budget refused it, its counter rows are missing, a replay, an earlier request
        of its tenant was one of these, or it is a request id's second ask):
        :meth:`requests_open` of those, in their order, decides them."""
        asks = _hold_asks(opens)
        batch, _ = _this_statement(asks, list(range(len(asks))))
        first = statements.holds_statement(asks=[asks[k] for k in batch], now=now)

        def read(rows: list[tuple[Any, ...]]) -> list[Request | None]:
            results: list[Request | None] = [None] * len(opens)
            for k, placed in zip(batch, first.read(rows), strict=True):
                if _placed_with_row(placed):
                    results[k] = _opened(opens[k], now=now)
            return results

        return statements.Statement(first.sql, first.params, read)

    def _holds_placed(
        self, *, asks: Sequence[statements.HoldAsk], now: datetime
    ) -> list[tuple[Hold, bool] | Exception]:
        """The hold statement over ``asks``, as if one after another in their order: each
        one's hold (the first one for a replay) and whether its request's row was written with
        it, or why not (BudgetExhausted, ValueError). One statement places them all, unless one
        is not placed as the others assumed (a budget refused it, its counter rows are
        missing, a replay): it is then resolved on its own, and its tenant's asks after it, and
        a request id's second ask, go in the next statement."""
        results: list[tuple[Hold, bool] | Exception | None] = [None] * len(asks)
        pending = list(range(len(asks)))
        while pending:
            batch, later = _this_statement(asks, pending)
            outcomes = statements.holds_place(asks=[asks[k] for k in batch], now=now)
            for k, placed in zip(batch, outcomes, strict=True):
                if placed.waits:
                    later.append(k)
                    continue
                try:
                    results[k] = self._hold_of(asks[k], placed, now=now)
                except (BudgetExhausted, ValueError) as exc:
                    results[k] = exc
            pending = sorted(later)
        return [r for r in results if r is not None]

    def _hold_of(
        self, ask: statements.HoldAsk, placed: statements.HoldOutcome, *, now: datetime
    ) -> tuple[Hold, bool]:
        """An ask's hold from the statement's outcome for it: placed; declined (its counter
        rows created, or locked, and the statement run again for it alone); refused; a
        replay."""
        if not placed.counted:  # a counter row is missing, or the clock is behind a row's window
            with transaction.atomic():
                budget_counters_ensure(tenant_id=ask.tenant_id, api_key_id=ask.api_key_id, now=now)
                statements.counters_lock(tenant_id=ask.tenant_id, api_key_id=ask.api_key_id)
                (placed,) = statements.holds_place(asks=[ask], now=now, summed=True)
        if placed.hold_id is not None:
            hold = statements.model_loaded(
                Hold,
                {
                    "id": placed.hold_id,
                    "request_id": ask.request_id,
                    "tenant_id": ask.tenant_id,
                    "api_key_id": ask.api_key_id,
                    "amount": ask.amount,
                    "remaining": ask.amount,
                    "state": HoldState.OPEN,
                    "created_at": now,
                    "closed_at": None,
                },
            )
            return hold, placed.request_created
        existing = Hold.objects.filter(request_id=ask.request_id).first()
        if existing is None:
            raise BudgetExhausted(status=_refusal(placed.budgets, now=now), amount=ask.amount)
        if existing.tenant_id != ask.tenant_id or existing.api_key_id != ask.api_key_id:
            raise ValueError(f"request {ask.request_id!r} is held for another tenant or key")
        return existing, False  # a replay: the first hold, whatever the budget says now

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
        """Settle a served request once: :meth:`requests_settle` of one."""
        ask = ToSettle(request_id, usage, tokens, priority, prices)
        return self.requests_settle(asks=[ask], now=now)[0]

    def requests_settle(self, *, asks: Sequence[ToSettle], now: datetime) -> list[Settled]:
        """Settle served requests once each, as if one after another in the order of ``asks``:
        write each one's token entry of at most ``tokens`` dollars and its priority entry (when
        the engine reported one) of at most ``priority.amount`` (``rules.settlement``), close
        its hold and count both, atomically with the request locked, and mark it served with
        its ``usage``. ``tokens`` was priced from ``prices``: written only if they are still
        the request's market's (REPRICED otherwise: the caller prices it again). The results,
        in the order of ``asks``.

        One statement settles them all, unless a budget cut one of them: that tenant's requests
        after it, and a request id's second ask, go in the next statement (so each is checked
        against what the ones before it really wrote)."""
        results: list[Settled | None] = [None] * len(asks)
        pending = list(range(len(asks)))
        ensured: set[tuple[int, int | None]] = set()
        while pending:
            batch, later = _this_statement(asks, pending)
            outcomes = statements.requests_settle(
                asks=[_statement_ask(asks[k]) for k in batch], now=now
            )
            missing: set[tuple[int, int | None]] = set()
            for k, fast in zip(batch, outcomes, strict=True):
                if fast.waits:
                    later.append(k)
                elif _declined(fast):
                    # Its tenant's or key's counter rows are missing: created, then settled.
                    assert fast.tenant_id is not None
                    owner = (fast.tenant_id, fast.api_key_id)
                    if owner in ensured:
                        raise RuntimeError(
                            f"request {asks[k].request_id!r}: its counter rows could not be created"
                        )
                    missing.add(owner)
                    later.append(k)
                else:
                    results[k] = _settled(asks[k], fast, now=now)
            for tenant_id, api_key_id in sorted(missing, key=lambda o: (o[0], o[1] or 0)):
                budget_counters_ensure(tenant_id=tenant_id, api_key_id=api_key_id, now=now)
            ensured |= missing
            pending = sorted(later)
        return [r for r in results if r is not None]

    def requests_settle_first(
        self, *, asks: Sequence[ToSettle], now: datetime
    ) -> statements.Statement[list[Settled | None]]:
        """The first statement of :meth:`requests_settle`, to run on any connection (in a
        transaction of its own): each request's result where it decided it; None where it wrote
        nothing and :meth:`requests_settle` is to decide it (an earlier request of its tenant
        was cut by a budget, its counter rows are missing, or it is a request id's second
        ask)."""
        batch, _ = _this_statement(asks, list(range(len(asks))))
        first = statements.settle_statement(asks=[_statement_ask(asks[k]) for k in batch], now=now)

        def read(rows: list[tuple[Any, ...]]) -> list[Settled | None]:
            results: list[Settled | None] = [None] * len(asks)
            for k, fast in zip(batch, first.read(rows), strict=True):
                if not (fast.waits or _declined(fast)):
                    results[k] = _settled(asks[k], fast, now=now)
            return results

        return statements.Statement(first.sql, first.params, read)

    def hold_close(self, *, request_id: str, now: datetime, fail_request: bool) -> bool:
        """Release the request's open hold, nothing charged; ``fail_request``: also mark the
        request failed if it is still queued. Returns whether the request failed now
        (``fail_request``, or no request row: whether a hold was released), else whether a
        hold was released."""
        fast = statements.hold_close(request_id=request_id, now=now, fail_request=fail_request)
        if not fast.counted:
            # The hold's tenant or key has no counter rows: created, then released.
            budget_counters_ensure(tenant_id=fast.tenant_id, api_key_id=fast.api_key_id, now=now)
            fast = statements.hold_close(request_id=request_id, now=now, fail_request=fail_request)
        if fail_request and fast.request_found:
            return fast.failed
        return fast.released

    def posted_prices(self, *, request_id: str) -> PostedPrices | None:
        """The request's market's prices now; None when there is no such request."""
        return statements.request_prices(request_id=request_id)


def _hold_asks(opens: Sequence[Open]) -> list[statements.HoldAsk]:
    asks = []
    for o in opens:
        request = {"market": o.fields["market_id"]}
        request.update((k, v) for k, v in o.fields.items() if k != "market_id")
        key_id = o.api_key.pk if o.api_key else None
        asks.append(statements.HoldAsk(o.request_id, o.tenant.pk, key_id, o.amount, request))
    return asks


def _placed_with_row(placed: statements.HoldOutcome) -> bool:
    """Whether the hold statement placed an ask's hold and wrote its request's row with it."""
    return (
        not placed.waits
        and placed.counted
        and placed.hold_id is not None
        and placed.request_created
    )


def _opened(o: Open, *, now: datetime) -> Request:
    """The row of a request the hold statement opened, from what it wrote."""
    return statements.model_loaded(
        Request,
        {
            "request_id": o.request_id,
            "tenant_id": o.tenant.pk,
            "api_key_id": o.api_key.pk if o.api_key else None,
            "status": RequestStatus.QUEUED,
            "created_at": now,
            **dict.fromkeys(_UNSET_AT_OPEN),
            **o.fields,
        },
    )


def _declined(fast: statements.SettleOutcome) -> bool:
    """Whether the settle statement declined a request: it is queued and priced as asked, but
    its tenant's or key's counter rows are missing (created, then it is settled again)."""
    return fast.status == RequestStatus.QUEUED and fast.priced and not fast.counted


def _this_statement(asks: Sequence[Any], pending: list[int]) -> tuple[list[int], list[int]]:
    """``pending``'s indices into ``asks`` split into this statement's and the next's: a
    request id asked twice goes in the next, where its second ask sees the first's result."""
    batch: list[int] = []
    later: list[int] = []
    ids: set[str] = set()
    for k in pending:
        (later if asks[k].request_id in ids else batch).append(k)
        ids.add(asks[k].request_id)
    return batch, later


def _statement_ask(ask: ToSettle) -> statements.SettleAsk:
    priority = ask.priority
    return statements.SettleAsk(
        request_id=ask.request_id,
        usage=asdict(ask.usage),
        tokens=ask.tokens,
        priority=None if priority is None else priority.amount,
        round_id="" if priority is None else priority.round_id,
        priority_detail=None if priority is None else priority.detail,
        prices=prices_of(ask.prices),
    )


def _settled(ask: ToSettle, fast: statements.SettleOutcome, *, now: datetime) -> Settled:
    """What the settle statement did with ``ask``, as the store's result."""
    if fast.status is None:
        return Settled(Outcome.UNKNOWN)
    if fast.status == RequestStatus.FAILED:
        return Settled(Outcome.NOT_SERVED)
    if fast.status == RequestStatus.SERVED:
        return Settled(Outcome.DUPLICATE)
    if not fast.priced:
        return Settled(Outcome.REPRICED)
    owner = {
        "request_id": ask.request_id,
        "tenant_id": fast.tenant_id,
        "api_key_id": fast.api_key_id,
        "market_id": fast.market_id,
        "created_at": now,
    }
    assert fast.tokens_detail is not None
    token_entry = statements.model_loaded(
        LedgerEntry,
        {
            **owner,
            "id": fast.tokens_id,
            "kind": ChargeKind.TOKENS,
            "round_id": "",
            "amount": fast.tokens_amount,
            "detail": json.loads(fast.tokens_detail),
        },
    )
    priority_entry = None
    if ask.priority is not None and fast.priority_id is not None:
        assert fast.priority_detail is not None
        priority_entry = statements.model_loaded(
            LedgerEntry,
            {
                **owner,
                "id": fast.priority_id,
                "kind": ChargeKind.PRIORITY,
                "round_id": ask.priority.round_id,
                "amount": fast.priority_amount,
                "detail": json.loads(fast.priority_detail),
            },
        )
    return Settled(Outcome.WRITTEN, token_entry, priority_entry)


def _refusal(rows: list[statements.BudgetRow], *, now: datetime) -> BudgetStatus:
    """The status of the first budget, in id order, that the hold statement found too full."""
    row = next(r for r in rows if not r.fits)
    budget = Budget(
        id=row.budget_id,
        api_key_id=row.api_key_id,
        period=row.period,
        limit=row.limit,
        soft_alert_fraction=row.soft_alert_fraction,
    )
    window = window_for(period=row.period, now=now)
    return budget_status_of(budget=budget, spent=row.spent, held=row.held, window=window, now=now)
