"""What a charge may be when it is written: the rule that keeps every budget whole (DESIGN.md 6).

**The invariant.** For every budget (a tenant's, a key's) and its current window,
``spent + held <= limit``; for a tenant's autobidder, ``spent <= budget`` over the priority
charges of the requests it bid for. It holds whatever the order and the delay of settlement:
a priority charge settled minutes after its request's token charge, records replayed or
redelivered, a worker paused while the gateway keeps placing holds.

**Why it holds.** A hold is placed only if it fits every budget (``budget_hold``). A charge
of a request is then written as at most

    its hold's remaining amount + what every budget has left (limit - spent - held, >= 0)

and, for a priority charge, at most the request's ``priority_cap`` (the priority part of its
hold: what the tenant consented to), and, for a priority charge of an autobid request, at most
what is left of the autobidder's budget. Writing ``c`` consumes ``min(c, remaining)`` of the
hold, so ``spent + held`` grows by ``c - min(c, remaining)``, which is at most what every budget
had left: each stays within its limit. What a cap cut is kept in the entry's detail
(``capped_at``, ``capped_by``, ``uncapped``), never silently dropped.

**Why a charge is rarely cut.** The hold stays open until both parts of the charge have
settled, or the priority part is known to be zero (no effective bid): a token charge that comes
first consumes the token part and keeps the priority part reserved for the round record that is
still to come (``hold_after``). A cut happens only where a hold was released before its
priority charge arrived, or a charge came out above the worst case the gateway held.

**What a budget has left** (:func:`budget_left`) is its limit less what was spent in its current
window and what is held; the window's spend is the counter row's (``BudgetCounter.spent_in``),
and a window newer than the writer's clock (a clock behind the row's) reads the row's window:
the most it can have spent.

The PostgreSQL statements (``accounts.ledger.statements``) and the reference ORM code
(``accounts.ledger.orm``) both apply these rules; this module is their reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING

from accounts.money import ZERO, money_str
from accounts.windows import window_for

if TYPE_CHECKING:
    from accounts.models import BudgetCounter

PRIORITY_CAP = "priority_cap"  # the priority part of the request's hold
BUDGET = "budget"  # a tenant's or key's budget
AUTOBIDDER_BUDGET = "autobidder_budget"  # the budget of the tenant's autobidder


@dataclass(frozen=True)
class Allowed:
    """A charge as it may be written (dollars) and, when less than asked, what capped it."""

    amount: Decimal
    capped_by: str | None  # PRIORITY_CAP, BUDGET, AUTOBIDDER_BUDGET, or None: not capped


def charge_allowed(
    *,
    asked: Decimal,
    priority_cap: Decimal | None,
    hold_remaining: Decimal,
    budget_room: Decimal | None,
    autobidder_room: Decimal | None,
) -> Allowed:
    """The most of ``asked`` dollars a charge may write.

    ``priority_cap``: the request's cap (priority charges; None: none); ``hold_remaining``: what
    the request's open hold still reserves (0 when closed); ``budget_room``: the least, over the
    budgets that apply, of limit - spent in the window - held (None: no budget applies);
    ``autobidder_room``: the autobidder's budget less its spend in the window (priority charges
    of autobid requests; None otherwise). Ties name the first cap in that order.
    """
    limits = [
        (priority_cap, PRIORITY_CAP),
        (None if budget_room is None else hold_remaining + max(budget_room, ZERO), BUDGET),
        (None if autobidder_room is None else max(autobidder_room, ZERO), AUTOBIDDER_BUDGET),
    ]
    amount, capped_by = asked, None
    for limit, name in limits:
        if limit is not None and limit < amount:
            amount, capped_by = limit, name
    return Allowed(amount=amount, capped_by=capped_by)


def capped_detail(detail: dict, *, allowed: Allowed, asked: Decimal) -> dict:
    """An entry's detail with what a cap cut, when one did (amounts as exact strings)."""
    if allowed.capped_by is None:
        return detail
    return {
        **detail,
        "capped_at": money_str(allowed.amount),
        "capped_by": allowed.capped_by,
        "uncapped": money_str(asked),
    }


def hold_after(
    *, remaining: Decimal, consumed: Decimal, close: bool, priority_cap: Decimal | None
) -> Decimal:
    """What a hold still reserves after a charge consumed ``consumed`` of its ``remaining``:
    nothing when ``close`` (both parts settled, or the priority part is known to be zero), else
    what is left, at most the priority part still to come (``priority_cap``; None: all of it)."""
    if close:
        return ZERO
    left = remaining - consumed
    return left if priority_cap is None else min(left, priority_cap)


def budget_left(*, limit: Decimal, counter: BudgetCounter, period: str, now: datetime) -> Decimal:
    """What a budget of ``limit`` dollars per ``period`` has left at ``now``: limit - spent in
    the window - held, from its scope's ``counter`` row (locked by the caller); may be < 0."""
    start = window_for(period=period, now=now).start
    spent = counter.spent_in(period=period, window_start=start)
    if spent is None:  # the caller's clock is behind the row's window
        spent = getattr(counter, f"{period}_spent")
    return limit - spent - counter.held
