"""Bounded waiting: an age credit that grows in a few steps, so that no request starves.

Under the DFS auctions a long prompt with a low bid has a low bid density, and while short and
urgent work keeps arriving it can wait without end. The operator's wait bound lifts it:

    level(a) = how many of the times W/k, 2W/k, ..., W the request has waited (0..k)
    credit   = level / k x density x its prompt tokens      ($/s; whole bid ticks in the tree)

for a request that has waited ``a`` seconds, with the bound ``wait_s`` W, ``steps`` k and the
``density`` d in dollars per second per prompt token. The DFS auctions key a block by its
effective bids plus its credits over its size (dfs_auction.py): a lone request that has waited W
ranks as if it bid about d per token of its work more than it did, whatever its length. The
credit depends on the request's age and length, never on a bid, and grows in k steps only.

The charges (payments.py) keep the real bids apart from the credit. A request's charge is what
its bid buys over bidding 0, its credit kept: its own credit counts with the others' bids in its
block (the key at bid z is (others + own credit + z) / size), so the critical bid for passing a
sibling of key k is k x size - others - own credit, and nobody pays for a credit. Since the
credit does not move with the own bid, the order stays monotone in it and the Myerson charge is
the crossing sum, exactly. Put the other way (the envelope theorem over the weighted welfare):
the charge is the delay the bid imposes on the others, valued at their bids plus their credits,
less the request's own credit times the time its bid saves it. The ledger sees bids and charges
only: a credit is never money.

Rounds stay incremental: a request's credit changes k times at most, and ``AgeClock`` keeps the
requests waiting for each level in the order they reach it, so a round gives new credits only
to the requests that crossed a step since the last one, at O(1) a step
(``RequestTree.credit_entries`` marks their paths changed, as new bids would, in one version),
and the planner redoes only those paths.

The tenant-level charges (payments.TenantCharges) take off what the standard charge bills for
the own tenant's other requests, so at their bids plus their credits, the same weights.

The market sets the bound (``wait_bound.py``: automatic from its waits, or pinned by the
operator, ``wait_bound_checked``; 0 is off); both engines read it from their knobs
(engines.contract.knobs) and run it through one ``WaitBound``, which gives the credits under the
DFS auctions only and follows a change of the bound at the next round.

The order book shows each subtree's credits beside its bids (book.py), and the quotes say what a
bid ranks as once its request has waited the bound (``wait_bound.ranks_as``).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from .requests import MAX_BID, number_checked, to_ticks
from .tree import Entry, RequestTree

# The credit's steps up to the bound and its density at the bound ($/s per prompt token), chosen
# on the KV sweep under the automatic bound (docs/benchmarks.md, "The bound's multiple, density
# and steps"): $0.003 met the market's goal on as many points as $0.002 or more, and on more than
# $0.004, at each multiple tried; 8 steps met it on as many points as 12 or 16 and on more than
# 4, and a round's credit changes are the steps x churn of its queue, so 8 costs the scheduler
# half what 16 does. (With a fixed 28 s bound, 4 steps of $0.05, the first defaults, met it on
# none more than no bound.) A gentle credit in several steps lifts the tail without undoing the
# auction: a stronger one puts every old request ahead of all bids and costs capture.
DEFAULT_STEPS = 8
DEFAULT_DENSITY = 0.003
# The operator's bound, seconds: 0 (off) or in this range. Below half a second the credit would
# step every round or two; above an hour no request waits that long behind a running engine.
WAIT_BOUND_MIN_S = 0.5
WAIT_BOUND_MAX_S = 3600.0


# What the operator's bound does, in the console's and the admin's words.
WAIT_BOUND_HELP = (
    f"A request that has waited this long ranks as if it bid ${DEFAULT_DENSITY * 1000:g}/s more "
    f"per 1,000 prompt tokens, reached in {DEFAULT_STEPS} steps as it waits (a credit, never "
    "money; the DFS auctions only)."
)


def wait_bound_checked(value: object) -> float:
    """The operator's wait bound in seconds (0: off), as a float; ValueError saying the range."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (value == 0 or WAIT_BOUND_MIN_S <= value <= WAIT_BOUND_MAX_S)
    ):
        raise ValueError(
            f"the wait bound must be 0 (off) or {WAIT_BOUND_MIN_S:g}..{WAIT_BOUND_MAX_S:g} "
            f"seconds, got {value!r}"
        )
    return float(value)


@dataclass(frozen=True, slots=True)
class AgeCredit:
    """The operator's wait bound: after ``wait_s`` seconds of waiting a request ranks as if it
    bid ``density`` dollars per second per prompt token more, reached in ``steps`` equal steps."""

    wait_s: float
    density: float
    steps: int = DEFAULT_STEPS

    def __post_init__(self) -> None:
        number_checked("wait_s", self.wait_s)
        d = self.density
        if isinstance(d, bool) or not isinstance(d, int | float) or not 0 < d <= MAX_BID:
            raise ValueError(f"density must be in (0, {MAX_BID:g}] $/s per token, got {d!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or not self.steps >= 1:
            raise ValueError(f"steps must be an int >= 1, got {self.steps!r}")

    def step_at(self, arrival: float, level: int) -> float:
        """When a request that arrived at ``arrival`` reaches credit level ``level`` (seconds)."""
        return arrival + level * self.wait_s / self.steps

    def level(self, arrival: float, now: float, known: int = 0) -> int:
        """The credit level (0..steps) at ``now`` of a request that arrived at ``arrival``.

        ``known``: a level it had reached before (``AgeClock``'s), where the count starts when
        it still holds at ``now``: ``step_at`` grows with the level (in floating point too), so
        every level below it holds as well and counting from 0 would pass them all."""
        level = known if known and self.step_at(arrival, known) <= now else 0
        while level < self.steps and self.step_at(arrival, level + 1) <= now:
            level += 1
        return level

    def credit_ticks(self, level: int, prompt_tokens: int) -> int:
        """The credit (bid ticks, rounded down) at ``level`` of a prompt of ``prompt_tokens``."""
        return to_ticks(self.density) * prompt_tokens * level // self.steps


class AgeClock:
    """The credits of a tree's waiting requests, brought up to date round by round.

    ``admit`` each request as it joins the tree; ``advance`` before each round gives the new
    credits of those that crossed a step. A request that left the tree is dropped when its next
    step comes up.

    A request reaches level ``l`` at ``arrival + l x wait_s / steps``, so the requests waiting
    for one level reach it in the order they arrived. Each level keeps its own queue of them in
    that order, and a round takes from each queue's front only the requests that are due: a step
    costs O(1). A request whose time would break its queue's order (it joined the clock after a
    later arrival: a request put back in the queue, or the clock started over a tree) waits in a
    heap instead, O(log n) a step.
    """

    def __init__(self, credit: AgeCredit) -> None:
        self.credit = credit
        # Level l's queue at index l - 1: (time it reaches l, request id), in time order.
        self._queues: list[deque[tuple[float, str]]] = [deque() for _ in range(credit.steps)]
        self._late: list[tuple[float, str]] = []  # the same, out of its queue's order
        # Request id -> its arrival, and -> its level: dicts of numbers, which the garbage
        # collector never walks (a dict of pairs it would, and this one holds every request).
        self._arrival: dict[str, float] = {}
        self._level: dict[str, int] = {}

    def admit(self, request_id: str, arrival: float) -> None:
        """Start the clock of a request that arrived at ``arrival`` (seconds), at level 0."""
        self._arrival[request_id] = arrival
        self._level[request_id] = 0
        self._schedule(self.credit.step_at(arrival, 1), request_id, 1)

    def _schedule(self, due: float, request_id: str, level: int) -> None:
        """Wait for ``level`` (reached at ``due``) in its queue, or in the heap if ``due`` is
        before the last in that queue."""
        queue = self._queues[level - 1]
        if queue and due < queue[-1][0]:
            heapq.heappush(self._late, (due, request_id))
        else:
            queue.append((due, request_id))

    def advance(self, tree: RequestTree, now: float) -> int:
        """Give the requests that crossed a step by ``now`` their new credits (one change of
        the tree: ``RequestTree.credit_entries``); returns how many changed."""
        arrivals, levels = self._arrival, self._level
        credit = self.credit
        entries = tree.entries
        credits: list[tuple[Entry, int]] = []
        steps = credit.steps
        per_token = to_ticks(credit.density)  # ``credit_ticks`` written out, the same integers
        step_at = credit.step_at
        queues = self._queues
        late = self._late
        pop = heapq.heappop
        schedule = self._schedule

        def crossed(rid: str) -> None:
            entry = entries.get(rid)
            arrival = arrivals.get(rid)
            if entry is None or arrival is None or entry.req.arrival != arrival:
                arrivals.pop(rid, None)  # it left the tree (admitted, cancelled)
                levels.pop(rid, None)
                return
            level = levels[rid]
            # ``AgeCredit.level`` from the level reached: this entry is due, so it holds.
            while level < steps and step_at(arrival, level + 1) <= now:
                level += 1
            levels[rid] = level
            credits.append((entry, per_token * len(entry.req.tokens) * level // steps))
            if level < steps:
                schedule(step_at(arrival, level + 1), rid, level + 1)

        for queue in queues:
            while queue and queue[0][0] <= now:
                crossed(queue.popleft()[1])
        while late and late[0][0] <= now:
            crossed(pop(late)[1])
        if credits:
            tree.credit_entries(credits)
        return len(credits)


class WaitBound:
    """An engine's wait bound, round by round: the one rule both engines run on their tree.

    ``admit`` each request as it joins the tree; ``advance`` before each round, with the credit
    rule in effect (``MarketKnobs.age_credit``: None when the bound is off or the policy is not a
    DFS auction). A new rule takes effect in that round: the credits given under the old one are
    taken back, and every waiting request's clock starts again from its arrival, so a request
    that has waited long gets its level at once. Between changes only the requests that crossed
    a step change the tree (``AgeClock``).
    """

    def __init__(self) -> None:
        self.credit: AgeCredit | None = None
        self.clock: AgeClock | None = None

    def admit(self, request_id: str, arrival: float) -> None:
        """A request joined the tree at ``arrival`` (seconds, the engine's clock)."""
        if self.clock is not None:
            self.clock.admit(request_id, arrival)

    def advance(self, tree: RequestTree, now: float, credit: AgeCredit | None) -> int:
        """Bring the tree's credits to ``now`` under ``credit``; returns how many changed."""
        changed = 0
        if credit != self.credit:
            for rid, entry in tree.entries.items():
                if entry.credit:
                    tree.set_credit(rid, 0)
                    changed += 1
            self.credit = credit
            self.clock = None if credit is None else AgeClock(credit)
            if self.clock is not None:
                for rid, entry in tree.entries.items():
                    self.clock.admit(rid, entry.req.arrival)
        if self.clock is None:
            return changed
        return changed + self.clock.advance(tree, now)
