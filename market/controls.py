"""The console's guards on a market's controls: what each policy does in one line, when a new
reserve asks for a confirmation, and what it would do to the book waiting now.

Pure rules (the views and the impact page read them): a reserve further than
``RESERVE_CONFIRM_FACTOR`` from the current one, either way, is applied only once confirmed,
since a slip of the keyboard (1,000,000 typed for 0.001) drops every bid in the book to 0 at
the engine's next round; from a reserve of 0, every raise is that far. A reserve above the
market's ceiling is refused outright (``market.services.market_reserve_set``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

RESERVE_CONFIRM_FACTOR = Decimal(10)

# One line per policy of the mechanism's registry (``mechanism.POLICIES``; docs/mechanism.md,
# "Orders and policies"), as the console's policy switch explains them.
POLICY_DESCRIPTIONS: dict[str, str] = {
    "fcfs": "First come, first served: arrival order; bids buy nothing.",
    "lpm": "Longest cached prefix first, for the cache; bids buy nothing.",
    "dfs-weight": "SGLang's order: each prefix subtree served together, the most waiting "
    "requests first; bids buy nothing.",
    "highest-bid": "Highest bid first, then arrival: priority for money, whatever the cache.",
    "dfs-auction": "Each prefix subtree served together; siblings by average bid.",
    "dfs-auction-density": "Each prefix subtree served together; siblings by bid per token of "
    "work (the most planned welfare among such orders).",
    "dfs-auction-kv": "As dfs-auction-density, with a cached subtree's work counted at a "
    "quarter, so it keeps its place under KV pressure.",
    "dfs-auction-kv-split": "As dfs-auction-kv, and a fully cached subtree's requests compete "
    "one by one among their parent's (the default).",
}


def policy_description(policy: str) -> str:
    """What ``policy`` does, in one line ("" for a policy not described here yet)."""
    return POLICY_DESCRIPTIONS.get(policy, "")


def reserve_needs_confirmation(old: Decimal, new: Decimal) -> bool:
    """Whether moving the reserve from ``old`` to ``new`` ($/s) must be confirmed: more than
    ``RESERVE_CONFIRM_FACTOR`` times it, or less than that fraction of it."""
    if new == old:
        return False
    if old == 0:
        return True
    factor = RESERVE_CONFIRM_FACTOR
    return new > old * factor or new * factor < old


@dataclass(frozen=True)
class ReserveImpact:
    """What a reserve would do to the book waiting now: of its ``waiting`` requests, how many
    bid under it (``below``) and under the reserve in force (``below_now``). ``exact`` is False
    when an engine's book carried a sample of its bids (a long queue): the counts are then
    that sample's shares of the queue, rounded."""

    waiting: int
    below: int
    below_now: int
    exact: bool

    @property
    def lose_priority(self) -> int:
        """Requests whose bids buy priority now and would not under the new reserve."""
        return max(0, self.below - self.below_now)

    @property
    def gain_priority(self) -> int:
        """Requests whose bids buy nothing now and would under the new reserve."""
        return max(0, self.below_now - self.below)


def reserve_impact(
    books: Sequence[tuple[Sequence[float], int]], *, reserve: float, current: float
) -> ReserveImpact:
    """The impact of ``reserve`` against ``current`` ($/s) on a book given as, per engine, its
    waiting bids ($/s, ascending) and how many requests wait there. A bid buys priority when it
    is at least the reserve (``mechanism.requests.effective_bid``)."""
    waiting = below = below_now = 0
    exact = True
    for bids, queued in books:
        n = len(bids)
        under, under_now = bisect_left(bids, reserve), bisect_left(bids, current)
        if n < queued:  # a sample of the queue's bids (or none): scale its shares up
            exact = False
            if n:
                under, under_now = round(queued * under / n), round(queued * under_now / n)
        waiting += max(n, queued)
        below += under
        below_now += under_now
    return ReserveImpact(waiting=waiting, below=below, below_now=below_now, exact=exact)
