"""The ledger store's interface and its typed results (see the package's docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, Protocol

from accounts.models import ApiKey, Hold, LedgerEntry, Request, Tenant
from accounts.money import PostedPrices, money_str
from accounts.selectors.budgets import BudgetStatus


class Outcome(StrEnum):
    """What a charge did."""

    WRITTEN = "written"  # the entry was written (``Charged.entry``)
    PENDING = "pending"  # a priority charge of a request still in flight: kept on its row
    DUPLICATE = "duplicate"  # the entry exists (a replay): nothing written
    UNKNOWN = "unknown"  # no such request, or not of the record's market
    NOT_SERVED = "not_served"  # the request failed: never charged
    REPRICED = "repriced"  # the amount came from prices that are no longer the market's


@dataclass(frozen=True, slots=True)
class Charged:
    """The result of :meth:`LedgerStore.charge_write`."""

    outcome: Outcome
    entry: LedgerEntry | None = None  # when WRITTEN


class BudgetExhausted(Exception):
    """A request does not fit a budget. Carries what the gateway's 402 answer needs."""

    def __init__(self, *, status: BudgetStatus, amount: Decimal) -> None:
        self.status = status
        self.amount = amount
        self.scope = status.scope
        self.remaining = status.remaining
        self.resets_at = status.resets_at
        self.seconds_until_reset = status.seconds_until_reset
        when = (
            "never resets"
            if status.seconds_until_reset is None
            else f"resets in {status.seconds_until_reset:.0f} s ({status.resets_at.isoformat()})"
        )
        super().__init__(
            f"{status.scope} budget exhausted: ${money_str(amount)} needed, "
            f"${money_str(status.remaining)} left of ${money_str(status.limit)} per "
            f"{status.period}; {when}"
        )


class LedgerStore(Protocol):
    """The ledger's writes. Amounts in dollars (``Decimal``, 9 places); ``now`` is the write's
    time, which decides the budget windows it counts in."""

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
        ...

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
        """:meth:`hold_place` and the request's row (``fields``: its market_id, bid, ...)
        together; a replay returns the row as it is."""
        ...

    def charge_write(
        self,
        *,
        request_id: str,
        kind: str,
        amount: Decimal,
        round_id: str,
        detail: dict[str, Any],
        now: datetime,
        market_slug: str | None = None,
        request_fields: dict[str, Any] | None = None,
        priced_by: PostedPrices | None = None,
    ) -> Charged:
        """Write the (request, ``kind``) entry of at most ``amount`` (``rules.charge_allowed``),
        consume the hold and count the charge, atomically with the request locked.
        ``market_slug``: only a request of that market; ``request_fields``: what a token charge
        records on the request (it is then served); ``priced_by``: the market ``amount`` was
        priced from, written only if its prices are still the request's market's (REPRICED
        otherwise: the caller prices it again). A token charge that finds a priority charge
        pending on the request writes it next."""
        ...

    def hold_close(self, *, request_id: str, now: datetime, fail_request: bool) -> bool:
        """Release the request's open hold, nothing charged; ``fail_request``: also mark the
        request failed if it is still queued. Returns whether the request failed now
        (``fail_request``, or no request row: whether a hold was released), else whether a
        hold was released."""
        ...

    def posted_prices(self, *, request_id: str) -> PostedPrices | None:
        """The request's market's prices now; None when there is no such request."""
        ...
