"""Truthful priority charges (DESIGN.md 4.4), computed from a round's plan without re-clearing.

Fix request i and let its bid z vary, the others fixed. Its planned completion C_i(z) is a step
function that falls each time i's block passes a competing block, so with the saved time
T_i(z) = C_i(0) - C_i(z) the Myerson payment with reserve r,

    p_i = b T_i(b) - integral_r^b T_i(z) dz,

is a sum over the blocks that i passes by bidding b instead of 0: each passed block contributes
(its work / tokens_per_second) x max(critical bid, r), where the critical bid is the lowest bid at
which i would go ahead of it. A bid under the reserve counts as 0 and so passes nothing.

DFS auctions: i's block at an ancestor A holds i and others with effective bids S, and has a size
D (requests, for dfs-auction) or work D (tokens, for dfs-auction-density). Its key with bid z is
(S + z) / D, so it passes a sibling block of key k at the critical bid k D - S. The siblings' keys
do not depend on i, and passing a sibling delays i by exactly the sibling's work, since blocks
are contiguous. Per ancestor this is a bisection and a few prefix sums over the sorted siblings.

highest-bid: lowering i's bid moves i alone later in a flat order; placed right after request m it
completes when m completes in the actual plan (the same prefix of work is done), so the steps are
the plan's own completion times, with critical bids the passed requests' bids.

Bids and reserve here are in bid ticks, amounts in ticks x tokens and savings in tokens: divide
by BID_SCALE x tokens_per_second for dollars, by tokens_per_second for seconds.

A policy names its charge rule in the registry (policies.py): ``DfsCharges`` for the DFS
auctions, ``FlatCharges`` for highest-bid, none for the bid-blind policies. A rule is built once
per round, from the round's plan, and answers for one request (``charge``) or for all (``every``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from itertools import accumulate
from typing import Protocol

from .tree import Entry, Node

# The cumulative work (tokens) of the first k requests of a round's order, given k.
CumsUpto = Callable[[int], list[int]]


class Charges(Protocol):
    """A round's priority charges, in bid ticks x tokens, with the planned savings in tokens."""

    def charge(self, entry: Entry) -> tuple[float, int]:
        """Charge and planned saving of one request of the round."""
        ...

    def every(self) -> list[float]:
        """Charge of every request, by position in the round's order."""
        ...


# Builds a round's Charges from (root, order, cums_upto, reserve ticks, per_work): ``per_work``
# is the DFS auctions' block size, work (bid density) rather than requests (average bid).
ChargeRule = Callable[[Node, list[Entry], CumsUpto, int, bool], Charges]


def _sibling_sums(x: Node) -> tuple[list, list[float], list[int], list[float]]:
    """Sort keys of the blocks at ``x``, their first parts, prefix sums of work and work x key."""
    if x.sums is None:
        blocks = x.blocks
        nks = [b.nk for b in blocks]
        works = [b.work for b in blocks]
        keys = list(zip(nks, [b.tie for b in blocks], strict=True))
        # A block with no work has an infinite key; it adds nothing (and must not add inf x 0).
        weighted = [-k * w if w else 0.0 for k, w in zip(nks, works, strict=True)]
        x.sums = (keys, nks, [0, *accumulate(works)], [0.0, *accumulate(weighted)])
    return x.sums


def _passed(nks, pw, pwk, lo, hi, size, others, reserve) -> float:
    """Charge for passing the blocks ``lo..hi-1``: each at max(its critical bid, reserve).

    The critical bid for block m is k_m x size - others; it is at least the reserve up to ``cut``.
    """
    cut = bisect_right(nks, -(others + reserve) / size, lo, hi) if reserve > 0 else hi
    return size * (pwk[cut] - pwk[lo]) - others * (pw[cut] - pw[lo]) + reserve * (pw[hi] - pw[cut])


def dfs_charge(entry: Entry, *, density: bool, reserve: int) -> tuple[float, int]:
    """Priority charge and planned saving of one request, from its node up to the root."""
    b = entry.bsum
    if b <= 0:
        return 0.0, 0
    total = 0.0
    saved = 0
    block = entry
    x = entry.node
    while x is not None:
        if x.only is None and len(x.blocks) > 1:
            size = block.work if density else block.n
            if size > 0:
                keys, nks, pw, pwk = _sibling_sums(x)
                others = block.bsum - b
                lo = bisect_left(keys, (block.nk, block.tie)) + 1
                hi = bisect_left(keys, (-(others / size), block.tie), lo)
                if hi > lo:
                    total += _passed(nks, pw, pwk, lo, hi, size, others, reserve)
                    saved += pw[hi] - pw[lo]
        block = x
        x = x.parent
    return _clamped(total, b, saved), saved


def _clamped(total: float, bid: int, saved: int) -> float:
    """The charge lies in [0, bid x saved]; prefix-sum rounding can stray by a few ulps."""
    return min(max(total, 0.0), float(bid * saved))


def dfs_payments(
    root: Node, order: list[Entry], *, density: bool, reserve: int
) -> tuple[list[float], list[int]]:
    """Charges and savings of every request, by position in the order.

    The same sums as ``dfs_charge``, taken node by node: the requests of a block are a contiguous
    run of the order, so each node's sorted siblings are looked up by all its requests in turn.
    A request passes the next sibling only if, with its bid at 0, its block's key would still be
    at least that sibling's: bids below ``floor`` cannot, and are skipped without a lookup.
    """
    n = len(order)
    pay = [0.0] * n
    saved = [0] * n
    bids = [e.bsum for e in order]
    stack = [root]
    while stack:
        x = stack.pop()
        blocks = x.blocks
        last = len(blocks) - 1
        if last == 0:
            b0 = blocks[0]
            if type(b0) is Node and b0.only is None:
                stack.append(b0)
            continue
        keys, nks, pw, pwk = _sibling_sums(x)
        zero = bisect_left(nks, 0.0)  # blocks from here on have key 0
        for j, block in enumerate(blocks):
            if type(block) is Node and block.only is None:
                stack.append(block)
            if j == last:
                continue
            size = block.work if density else block.n
            if size <= 0:
                continue
            lo = j + 1
            tie = block.tie
            bsum = block.bsum
            start = block.first
            if block.n == 1:
                # A single request: at bid 0 its key is 0, whatever its bid was.
                if bsum <= 0:
                    continue
                hi = last + 1 if zero > last else bisect_left(keys, (0.0, tie), max(lo, zero))
                if hi <= lo:
                    continue
                if reserve > 0:
                    cut = bisect_right(nks, -reserve / size, lo, hi)
                    pay[start] += size * (pwk[cut] - pwk[lo]) + reserve * (pw[hi] - pw[cut])
                else:
                    pay[start] += size * (pwk[hi] - pwk[lo])
                saved[start] += pw[hi] - pw[lo]
                continue
            nxt = keys[lo]
            # others / size <= next key  <=>  bid >= bsum - size x next key (up to rounding).
            floor = bsum + size * nks[lo]
            floor -= 1 + abs(floor) * 1e-9
            for k in range(start, start + block.n):
                b = bids[k]
                if b <= 0 or b < floor:
                    continue
                others = bsum - b
                key0 = (-(others / size), tie)
                if key0 < nxt:
                    continue
                hi = bisect_left(keys, key0, lo)
                if reserve > 0:
                    cut = bisect_right(nks, -(others + reserve) / size, lo, hi)
                    pay[k] += (
                        size * (pwk[cut] - pwk[lo])
                        - others * (pw[cut] - pw[lo])
                        + reserve * (pw[hi] - pw[cut])
                    )
                else:
                    pay[k] += size * (pwk[hi] - pwk[lo]) - others * (pw[hi] - pw[lo])
                saved[k] += pw[hi] - pw[lo]
    # The charge lies in [0, bid x saved]; prefix-sum rounding can stray by a few ulps.
    for k, amount in enumerate(pay):
        if amount:
            top = float(bids[k] * saved[k])
            pay[k] = 0.0 if amount < 0.0 else (top if amount > top else amount)
    return pay, saved


class DfsCharges:
    """Charges for the DFS auctions: one request from its node up, or all node by node."""

    def __init__(
        self, root: Node, order: list[Entry], cums_upto: CumsUpto, reserve: int, per_work: bool
    ) -> None:
        self.root = root
        self.order = order
        self.reserve = reserve
        self.density = per_work

    def charge(self, entry: Entry) -> tuple[float, int]:
        """Priority charge and planned saving of one request (``dfs_charge``)."""
        return dfs_charge(entry, density=self.density, reserve=self.reserve)

    def every(self) -> list[float]:
        """Priority charge of every request, by position in the order (``dfs_payments``)."""
        return dfs_payments(self.root, self.order, density=self.density, reserve=self.reserve)[0]


class FlatCharges:
    """Charges for highest-bid, from the plan's order and its cumulative work.

    ``cums_upto(k)`` gives the cumulative work of the first k requests (it may work it out on
    demand); a request's charge needs it up to where the request would stand at bid 0.
    """

    def __init__(
        self,
        root: Node,
        order: list[Entry],
        cums_upto: CumsUpto,
        reserve: int,
        per_work: bool = False,
    ) -> None:
        self.keys = [(e.nk, e.tie) for e in order]
        self.cums_upto = cums_upto
        self.order = order
        self.reserve = reserve
        self.values = [0]  # values[m] = sum over k < m of (cum_k - cum_{k-1}) x max(bid_k, r)
        self._positions: dict[str, int] | None = None

    def charge(self, entry: Entry) -> tuple[float, int]:
        """Priority charge and planned saving of one request (``charge_at`` its position)."""
        if self._positions is None:
            self._positions = {e.req.id: i for i, e in enumerate(self.order)}
        return self.charge_at(self._positions[entry.req.id])

    def every(self) -> list[float]:
        """Priority charge of every request, by position in the order."""
        return [self.charge_at(p)[0] for p in range(len(self.order))]

    def _values_upto(self, k: int) -> list:
        values = self.values
        if len(values) <= k:
            cums = self.cums_upto(k)
            reserve = self.reserve
            for m in range(len(values) - 1, k):
                b = self.order[m].bsum
                prev = cums[m - 1] if m else 0
                values.append(values[-1] + (cums[m] - prev) * (b if b > reserve else reserve))
        return values

    def charge_at(self, p: int) -> tuple[float, int]:
        """Priority charge and planned saving of the request at position ``p`` of the order."""
        e = self.order[p]
        if e.bsum <= 0:
            return 0.0, 0
        q = bisect_left(self.keys, (0, e.tie), p + 1)
        if q <= p + 1:
            return 0.0, 0
        values = self._values_upto(q)
        cums = self.cums_upto(q)
        return values[q] - values[p + 1], cums[q - 1] - cums[p]
