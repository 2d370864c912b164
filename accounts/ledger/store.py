"""The ledger store's typed results (see the package's docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any

from accounts.figures import duration, usd, usd_apart
from accounts.models import ApiKey, LedgerEntry, Tenant
from accounts.models.ledger import TOKEN_COUNTS
from accounts.money import PostedPrices, money_str
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
class Open:
    """A request to open: hold ``amount`` dollars for it and record its row (``fields``: its
    market_id, bid, priority_cap, request_class, bid_source, gateway)."""

    tenant: Tenant
    api_key: ApiKey | None
    request_id: str
    amount: Decimal
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToSettle:
    """A served request to settle: its ``usage``, its token charge (dollars, priced from
    ``prices``) and the priority charge its engine reported (None: none)."""

    request_id: str
    usage: Usage
    tokens: Decimal
    priority: PriorityCharge | None
    prices: PostedPrices


@dataclass(frozen=True, slots=True)
class Settled:
    """The result of :meth:`~accounts.ledger.postgres.PostgresLedger.request_settle`."""

    outcome: Outcome
    tokens: LedgerEntry | None = None  # when WRITTEN
    priority: LedgerEntry | None = None  # when WRITTEN with a priority charge


class BudgetExhausted(Exception):
    """A request does not fit a budget. Carries what the gateway's 429 ``insufficient_quota``
    answer needs: its message, for a person, and the same figures for a program
    (:meth:`figures`).

    Two refusals read differently (``reason``): ``exceeds_remaining``, the budget has room
    left but this request's hold is larger than it (lower the bid or ``max_tokens``, or raise
    the budget), and ``used_up``, what was spent and is held leaves nothing (wait for requests
    in flight or the reset, or raise the budget). The message names the budget that refused
    (scope and period), its spent, held and left, what the request needed and when it resets,
    as figures for people (:mod:`accounts.figures`; the exact figures are on ``status``)."""

    EXCEEDS_REMAINING = "exceeds_remaining"
    USED_UP = "used_up"

    def __init__(self, *, status: BudgetStatus, amount: Decimal) -> None:
        self.status = status
        self.amount = amount
        self.scope = status.scope
        self.remaining = status.remaining
        self.resets_at = status.resets_at
        self.seconds_until_reset = status.seconds_until_reset
        self.reason = self.USED_UP if status.remaining <= 0 else self.EXCEEDS_REMAINING
        super().__init__(_refusal_message(status, amount, self.reason))

    def figures(self) -> dict[str, object]:
        """The refusal's figures, JSON-ready: amounts as exact dollar strings (9 places), the
        reset as ISO 8601 UTC (null: the budget never resets)."""
        status = self.status
        return {
            "reason": self.reason,
            "budget_id": status.budget_id,
            "scope": status.scope,
            "period": status.period,
            "limit": money_str(status.limit),
            "spent": money_str(status.spent),
            "held": money_str(status.held),
            "remaining": money_str(status.remaining),
            "needed": money_str(self.amount),
            "resets_at": status.resets_at.isoformat() if status.resets_at else None,
            "seconds_until_reset": status.seconds_until_reset,
        }


def _refusal_message(status: BudgetStatus, amount: Decimal, reason: str) -> str:
    """What happened and what to do, in figures for people."""
    whose = "this API key's" if status.scope == "key" else "the tenant's"
    per = "with no period" if status.period == "none" else f"per {status.period}"
    resets = False
    when = "It never resets."
    if status.resets_at is not None and status.seconds_until_reset is not None:
        resets = True
        when = (
            f"It resets at {status.resets_at.isoformat()} "
            f"(in {duration(status.seconds_until_reset)})."
        )
    left, needs = usd_apart(status.remaining, amount)
    spent_held = f"{usd(status.spent)} spent, {usd(status.held)} held for requests in flight"
    if reason == BudgetExhausted.EXCEEDS_REMAINING:
        beyond = (
            "; it is more than the whole budget, so the reset will not make room"
            if amount > status.limit
            else ""
        )
        return (
            f"This request's hold, up to {needs}, is more than the {left} left of {whose} "
            f"budget of {usd(status.limit)} {per} ({spent_held}){beyond}. The hold is the "
            "prompt and max_tokens at the market's prices plus the bid times the market's hold "
            f"horizon: lower the bid or max_tokens, or raise the budget. {when}"
        )
    if status.held > 0:
        remedy = "Retry once requests in flight finish (what they hold and do not spend "
        remedy += "comes back), after the reset, or raise the budget."
        if not resets:
            remedy = remedy.replace(", after the reset,", ",")
    else:
        remedy = "Retry after the reset, or raise the budget." if resets else "Raise the budget."
    return (
        f"{whose[0].upper()}{whose[1:]} budget of {usd(status.limit)} {per} is used up: "
        f"{spent_held}, {left} left; this request needs up to {needs}. {when} {remedy}"
    )
