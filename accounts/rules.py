"""What a request may be charged when it is settled: the rule that keeps every budget whole.

A request's money moves like a two-phase transfer. The gateway places one **hold** before it
forwards the request (``request_open``: it must fit every budget), and resolves it exactly once:
**settled** when the engine's answer is complete, with both charges (its tokens at the posted
prices and the priority charge the engine reported from the round that admitted it), or
**released** when it was not served (nothing charged). A hold is sized to what the request is
likely to cost, not to the worst case (below): the rule after keeps the budgets whole whatever
the hold was.

**The invariant.** For every budget (a tenant's, a key's) and its current window,
``spent + held <= limit``; for a tenant's autobidder, ``spent <= budget`` over the priority
charges of the requests it bid for. It holds whatever the order of the writes: requests held
and settled concurrently, a hold released before its request is settled, a window's end
between the two.

**How much is held.** The token part is the worst case (prompt tokens at the input price,
``max_tokens`` at the output price), which is known. The priority part is what the request is
likely to be charged (:func:`priority_hold`): its effective bid x the market's **hold horizon**,
the high quantile of what recent requests of the market were charged per $/s of effective bid
(:func:`hold_horizon_s`: seconds, renewed by ``market.holds.hold_horizon_renew``), at most
what the tenant consented to. A request charged more than its hold is still charged in full
while the budget has room; only at a budget's edge may the rule below cut it.

**Why it holds.** A hold is placed only if it fits every budget. At settlement the request may
spend its **room**,

    room = its hold's remaining amount + what every budget has left (limit - spent - held, >= 0)

The token charge takes first, at most the room; the priority charge takes at most what is left
of the room, at most the request's ``priority_cap`` (what the tenant consented to: effective
bid x the market's ``max_wait_s``, or the autobid's worst case) and, for an autobid request, at
most what is left of the autobidder's budget. The hold closes, so ``spent + held`` grows by
``tokens + priority - hold <= what every budget had left``: each stays within its limit. What a
limit cut is kept in the entry's detail (``capped_at``, ``capped_by``, ``uncapped``), never
silently dropped; a cut that is not the consent cap leaves money uncollected, which is measured
(``accounts.selectors.collection``).

**What a budget has left** (:func:`left`) is its limit less what was spent in its current
window and what is held. A window's spend is kept on a counter row (``BudgetCounter``, and the
autobidder's row likewise) for the window the row has seen last (:func:`window_counted`); read
for another window (:func:`window_spent`) it is 0 when that window is newer, and unknown when it
is older (the ledger is summed then); read for what is left (:func:`window_spent_at_most`), a
window older than the row's (a writer's clock behind the row's) reads the row's: the most it
can have spent.

**Written once.** Each rule is one function of ``x`` (``accounts.algebra``): with ``SQL`` it
is the expression the ledger's statements run (``accounts.ledger.statements``); with
``VALUES`` it computes (the models, the selectors, and the tests' reference ledger, which the
statements are checked against). Nothing here is restated in SQL by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from accounts.algebra import Sql, Values
from accounts.money import money
from mechanism.pacing import high_quantile

X = Values | Sql  # the two readings of a rule

PRIORITY_CAP = "priority_cap"  # what the tenant consented to for the request's priority
BUDGET = "budget"  # a tenant's or key's budget (with the request's hold)
AUTOBIDDER_BUDGET = "autobidder_budget"  # the budget of the tenant's autobidder

# The hold horizon: HOLD_MARGIN x the HOLD_QUANTILE of the seconds charged per $/s of effective
# bid over a market's last HOLD_WINDOW priced requests, never under HOLD_HORIZON_FLOOR_S (a
# market whose charges were all ~0 still reserves something for a burst of contention);
# HOLD_HORIZON_PRIOR_S until HOLD_MIN_SAMPLES are known. Chosen by the bursts at a budget's edge
# of ``benchmarks.holds``: no variant left anything uncollected, a margin of 2 bought nothing
# measurable, and a floor of 1 s left the budget unspent (the 99th percentile ran 0.02-0.13 s).
HOLD_QUANTILE = 0.99
HOLD_WINDOW = 512
HOLD_MIN_SAMPLES = 32
HOLD_MARGIN = 1.0
HOLD_HORIZON_FLOOR_S = 0.05
HOLD_HORIZON_PRIOR_S = 1.0


def hold_horizon_s(
    charged_s: Iterable[float],
    *,
    max_wait_s: float,
    margin: float = HOLD_MARGIN,
    floor_s: float = HOLD_HORIZON_FLOOR_S,
) -> float:
    """A market's hold horizon, seconds: ``margin`` x the ``HOLD_QUANTILE`` of ``charged_s``
    (each a recent request's priority charge, uncut, over its effective bid: $ / ($/s)), at
    least ``floor_s``, at most ``max_wait_s``; ``HOLD_HORIZON_PRIOR_S`` while fewer than
    ``HOLD_MIN_SAMPLES`` are known."""
    values = [s for s in charged_s if s >= 0]
    horizon = HOLD_HORIZON_PRIOR_S
    if len(values) >= HOLD_MIN_SAMPLES:
        horizon = max(floor_s, margin * high_quantile(values, HOLD_QUANTILE))
    return min(horizon, max_wait_s)


def priority_hold(*, effective_bid: Decimal, horizon_s: float, consent_cap: Decimal) -> Decimal:
    """The priority part of a request's hold, dollars: ``effective_bid`` ($/s) x the market's
    hold horizon (seconds), at most ``consent_cap`` (what the tenant consented to)."""
    return min(consent_cap, money(effective_bid * Decimal(repr(horizon_s))))


def window_spent(x: X, *, kept_start: Any, kept_spent: Any, start: Any) -> Any:
    """What a row keeping a window that starts at ``kept_start`` (``kept_spent`` dollars) says
    was spent in the window that starts at ``start``: its sum when it is that window, 0 when
    that window is newer (nothing counted in it yet), absent when it is older (the row has moved
    on: the ledger is summed for it)."""
    return x.by_window(kept_start, start, same=kept_spent, newer=x.zero, older=x.null)


def window_spent_at_most(x: X, *, kept_start: Any, kept_spent: Any, start: Any) -> Any:
    """:func:`window_spent`, read for what is left: a window older than the row's (the reader's
    clock is behind the row's) reads the row's, the most it can have spent."""
    spent = window_spent(x, kept_start=kept_start, kept_spent=kept_spent, start=start)
    return x.coalesce(spent, kept_spent)


def window_counted(x: X, *, kept_start: Any, kept_spent: Any, start: Any, amount: Any) -> Any:
    """A row's window after counting ``amount`` dollars charged in the window that starts at
    ``start``: (its start, its spend). Added in the same window; the first charge of a newer
    window starts it; a charge of an older window leaves the row's newer one alone."""
    same = x.add(kept_spent, amount)
    spent = x.by_window(kept_start, start, same=same, newer=amount, older=kept_spent)
    return x.later(kept_start, start), spent


def left(x: X, *, limit: Any, spent: Any, held: Any) -> Any:
    """What a budget of ``limit`` dollars has left: limit - spent in its window - held (may be
    < 0: a limit lowered below what was spent)."""
    return x.sub(x.sub(limit, spent), held)


def fits(x: X, *, limit: Any, spent: Any, held: Any, amount: Any) -> Any:
    """Whether ``amount`` dollars more can be held: spent + held + amount <= limit."""
    return x.at_most(x.add(x.add(spent, held), amount), limit)


def settlement(
    x: X,
    *,
    tokens: Any,
    priority: Any,
    priority_cap: Any,
    hold_remaining: Any,
    budget_room: Any,
    autobidder_room: Any,
) -> tuple[Any, Any, Any, Any]:
    """The most of the ``tokens`` and ``priority`` dollars asked that a settlement may write
    (the module's docstring): (tokens, what cut them, priority, what cut it), a cut None (NULL)
    when nothing did; nothing asked for priority (None), nothing written.

    ``priority_cap``: the request's consent cap (None: none); ``hold_remaining``: what its open
    hold still reserves (0 when released); ``budget_room``: the least, over the budgets that
    apply, of :func:`left` (None: no budget applies); ``autobidder_room``: the autobidder's
    budget less its spend in the window (autobid requests; None otherwise). Ties name the first
    limit in the order cap, budget, autobidder.
    """
    room = x.add(hold_remaining, x.clip0(budget_room))
    taken, tokens_cut = x.capped(tokens, [(room, BUDGET)])
    limits = [
        (priority_cap, PRIORITY_CAP),
        (x.sub(room, taken), BUDGET),
        (x.clip0(autobidder_room), AUTOBIDDER_BUDGET),
    ]
    paid, priority_cut = x.capped(priority, limits)
    return taken, tokens_cut, paid, priority_cut
