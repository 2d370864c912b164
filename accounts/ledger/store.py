"""The ledger store's interface and its typed results (see the package's docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, Protocol

from accounts.figures import duration, usd, usd_apart
from accounts.models import ApiKey, Hold, LedgerEntry, Request, Tenant
from accounts.money import PostedPrices
from accounts.selectors.budgets import BudgetStatus


class Outcome(StrEnum):
    """What a settlement did."""

    WRITTEN = "written"  # the entries were written (``Settled``)
    DUPLICATE = "duplicate"  # the request was settled already (a replay): nothing written
    UNKNOWN = "unknown"  # no such request
    NOT_SERVED = "not_served"  # the request failed: never charged
    REPRICED = "repriced"  # the amount came from prices that are no longer the market's


@dataclass(frozen=True, slots=True)
class PriorityCharge:
    """The priority charge an engine reported for a request, from the round that admitted it
    (dollars, before any limit), and that round's view of the request."""

    amount: Decimal
    round_id: str
    detail: dict[str, Any]  # a PriorityDetail


@dataclass(frozen=True, slots=True)
class Usage:
    """What a served request used, as its engine reported it: tokens, and latencies in
    seconds (None: not reported)."""

    prompt_tokens: int  # all of them, cached included
    cached_tokens: int
    completion_tokens: int
    ttft_s: float | None = None
    e2e_s: float | None = None

    def tokens_detail(self) -> dict[str, int]:
        """The token entry's detail (a TokensDetail)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
        }


@dataclass(frozen=True, slots=True)
class Settled:
    """The result of :meth:`LedgerStore.request_settle`."""

    outcome: Outcome
    tokens: LedgerEntry | None = None  # when WRITTEN
    priority: LedgerEntry | None = None  # when WRITTEN with a priority charge


class BudgetExhausted(Exception):
    """A request does not fit a budget. Carries what the gateway's 429 ``insufficient_quota``
    answer needs; its message is for a person: the budget that refused (scope and period), its
    spent, held and left, what the request needed, and when it resets, as figures for people
    (:mod:`accounts.figures`; the exact figures are on ``status``)."""

    def __init__(self, *, status: BudgetStatus, amount: Decimal) -> None:
        self.status = status
        self.amount = amount
        self.scope = status.scope
        self.remaining = status.remaining
        self.resets_at = status.resets_at
        self.seconds_until_reset = status.seconds_until_reset
        whose = "This API key's" if status.scope == "key" else "The tenant's"
        per = "with no period" if status.period == "none" else f"per {status.period}"
        when = (
            "It never resets."
            if status.resets_at is None or status.seconds_until_reset is None
            else f"It resets at {status.resets_at.isoformat()} "
            f"(in {duration(status.seconds_until_reset)})."
        )
        left, needs = usd_apart(status.remaining, amount)
        super().__init__(
            f"{whose} budget of {usd(status.limit)} {per} is exhausted: "
            f"{usd(status.spent)} spent, {usd(status.held)} held for requests "
            f"in flight, {left} left; this request needs up to {needs}. {when}"
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
        """Settle a served request once: write its token entry of at most ``tokens`` dollars
        and its priority entry (when the engine reported one) of at most ``priority.amount``
        (``rules.settlement_allowed``), close its hold and count both, atomically with the
        request locked, and mark it served with its ``usage``. ``tokens`` was priced from
        ``prices``: written only if they are still the request's market's (REPRICED
        otherwise: the caller prices it again)."""
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
