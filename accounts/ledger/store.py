"""The ledger store's typed results (see the package's docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any

from accounts.figures import duration, usd, usd_apart
from accounts.models import LedgerEntry
from accounts.models.ledger import TOKEN_COUNTS
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
        return {name: getattr(self, name) for name in TOKEN_COUNTS}


@dataclass(frozen=True, slots=True)
class Settled:
    """The result of :meth:`~accounts.ledger.postgres.PostgresLedger.request_settle`."""

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
