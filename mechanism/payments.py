"""Truthful priority charges (docs/mechanism.md, "Payments"), computed from a round's plan
without re-clearing.

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
are contiguous. Per ancestor this is a bisection and a few prefix sums over the sorted siblings
(``_passed``); reference.crossing_charge is the same sum, by brute force.

The block's size, and so the critical bid, is the key's (plan.BlockKey.size, the plan's ``key``).
The KV auctions divide a block's size by their boost where the block counts as cached
(plan.block_cached). dfs-auction-kv-split orders the contracted tree (plan.py): a fully cached
subtree's blocks are siblings among its parent's, and a request's ancestors are the nodes above
it that are not split. Its blocks are still contiguous and each one's work is what serving it
computes (a split subtree's edge costs nothing), so the same sums hold over the contracted tree.

highest-bid: lowering i's bid moves i alone later in a flat order; placed right after request m it
completes when m completes in the actual plan (the same prefix of work is done), so the steps are
the plan's own completion times, with critical bids the passed requests' bids.

Age credits (aging.py): a request's credit is in its block's bid sum but is not its bid. Its
bid z varies with the credit kept, so the credit counts with the others' bids (in ``others``;
a lone request's key at bid 0 is its credit's) and nobody is charged for a credit.

Bids and reserve here are in bid ticks, amounts in ticks x tokens and savings in tokens: divide
by BID_SCALE x tokens_per_second for dollars, by tokens_per_second for seconds.

A policy names its charge rule in the registry (policies.py): ``DfsCharges`` for the DFS
auctions, ``FlatCharges`` for highest-bid, none for the bid-blind policies. A rule is built once
per round, from the round's plan, and answers for one request (``charge``) or for all (``every``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from operator import add
from typing import Protocol, overload

from .plan import BSUM, INNER, NK, REQUESTS, WORK, Block, BlockKey, NodeLookup, Plan
from .requests import effective_bid
from .tree import Entry, Node

# The cumulative work (tokens) of the first k requests of a round's order, given k.
CumsUpto = Callable[[int], list[int]]

# A node's sibling sums: the blocks' -key, prefix sums of their work and of work x key.
Sums = tuple[list[float], list[int], list[float]]

# A block of several requests charged after the walk (``dfs_payments``): its node's blocks,
# their sums, its index there and its first position in the order.
_Later = tuple[list[Block], Sums, int, int]


class Charges(Protocol):
    """A round's priority charges, in bid ticks x tokens, with the planned savings in tokens."""

    def charge(self, entry: Entry) -> tuple[float, int]:
        """Charge and planned saving of one request of the round."""
        ...

    def every(self) -> list[float]:
        """Charge of every request, by position in the round's order."""
        ...


# Builds a round's Charges from (plan, cums_upto, reserve ticks).
ChargeRule = Callable[[Plan, CumsUpto, int], Charges]


def _sibling_sums(blocks: list[Block]) -> Sums:
    """A node's sorted blocks: their ``nk``, prefix sums of work and of work x key.

    The blocks themselves are the sort keys that a ``(nk, tie)`` pair bisects (plan.py).
    """
    nks = [b[NK] for b in blocks]
    works = [b[WORK] for b in blocks]
    # A block with no work has an infinite key; it adds nothing (and must not add inf x 0).
    weighted = [-k * w if w else 0.0 for k, w in zip(nks, works, strict=True)]
    return nks, [0, *accumulate(works)], [0.0, *accumulate(weighted)]


def _passed(
    nks: list[float],
    pw: list[int],
    pwk: list[float],
    lo: int,
    hi: int,
    size: float,
    others: float,
    reserve: int,
) -> float:
    """The crossing sum: the charge for passing the blocks ``lo..hi-1`` of a node, each at
    max(its critical bid, reserve), times its work.

    The passing block has a key's ``size`` and the effective bids ``others`` besides the
    request's; the critical bid for block m is k_m x size - others, at least the reserve up to
    ``cut``.
    """
    cut = bisect_right(nks, -(others + reserve) / size, lo, hi) if reserve > 0 else hi
    return size * (pwk[cut] - pwk[lo]) - others * (pw[cut] - pw[lo]) + reserve * (pw[hi] - pw[cut])


def effective_bids(order: list[Entry], reserve: int) -> list[int]:
    """The effective bid (ticks) of each request of an order (requests.effective_bid)."""
    return [effective_bid(e.ticks, reserve, 0) for e in order]


def request_block(plan: Plan, entry: Entry, *, reserve: int) -> tuple[Node, int]:
    """Where a request is a block of its own in a DFS plan: the node whose blocks hold it, and
    its index there.

    The node is the request's, or the parent of a leaf that holds only it (that leaf's block is
    the request's, its edge included), or, where the plan splits fully cached subtrees, the
    nearest ancestor of that node that is not split. The block is found by its key, worked out
    as the planner does (dfs_auction._child_blocks, _own_blocks), so that the planner files
    nothing per request.
    """
    key, _, inside, _ = _dfs(plan)
    node = entry.node
    b = effective_bid(entry.ticks, reserve, 0) + entry.credit  # the planner's: bid and age credit
    work = plan.overhead
    if node.size == 1:
        work += node.ew
        up = node.parent
        assert up is not None  # a request never ends at the root: its tokens are not empty
        node = up
    x = _unsplit(node, key.split_cached)
    siblings = inside[x]
    i = bisect_left(siblings, (key.nk(b, 1, work, key.counts_cached(entry)), entry.tie))
    if i == len(siblings) or siblings[i][INNER] is not entry:
        raise RuntimeError(f"request {entry.req.id!r} is not where its round's plan put it")
    return x, i


def _dfs(plan: Plan) -> tuple[BlockKey, NodeLookup[Block], NodeLookup[list[Block]], Node]:
    """A DFS auction's plan's key, blocks, ``inside`` and root; ValueError for another plan."""
    key, blocks, inside, root = plan.key, plan.blocks, plan.inside, plan.root
    if key is None or blocks is None or inside is None or root is None:
        raise ValueError("the plan is not a DFS auction's: it keeps no blocks")
    return key, blocks, inside, root


# A node's unsplit ancestor is a node: the root is never split (Node.fully_cached).
@overload
def _unsplit(x: Node, split: bool) -> Node: ...
@overload
def _unsplit(x: Node | None, split: bool) -> Node | None: ...
def _unsplit(x: Node | None, split: bool) -> Node | None:
    """``x``, or with ``split`` its nearest ancestor that is not split (``Node.fully_cached``):
    a split subtree's blocks are its parent's, and its own block is in no order."""
    if split:
        while x is not None and x.fully_cached():
            x = x.parent
    return x


def dfs_charge(
    plan: Plan,
    entry: Entry,
    *,
    reserve: int,
    sums: Callable[[Node], Sums] | None = None,
) -> tuple[float, int]:
    """Priority charge and planned saving of one request, from its block up to the root.

    ``sums(x)`` gives node x's sibling sums (a cache of ``_sibling_sums``; built afresh if None).
    """
    b = effective_bid(entry.ticks, reserve, 0)
    if b <= 0:
        return 0.0, 0
    key, blocks_of, inside, _ = _dfs(plan)
    node, i = request_block(plan, entry, reserve=reserve)
    block = inside[node][i]
    total = 0.0
    saved = 0
    x: Node | None = node
    while x is not None:
        siblings = inside[x]
        if len(siblings) > 1:
            nk, tie, n, bsum, work, inner = block
            size = key.size(n, work, key.counts_cached(inner))
            if size > 0:
                nks, pw, pwk = _sibling_sums(siblings) if sums is None else sums(x)
                others = bsum - b
                lo = bisect_left(siblings, (nk, tie)) + 1
                hi = bisect_left(siblings, (-(others / size), tie), lo)
                if hi > lo:
                    total += _passed(nks, pw, pwk, lo, hi, size, others, reserve)
                    saved += pw[hi] - pw[lo]
        block = blocks_of[x]
        x = _unsplit(x.parent, key.split_cached)
    return _clamped(total, b, saved), saved


def _clamped(total: float, bid: int, saved: int) -> float:
    """The charge lies in [0, bid x saved]; prefix-sum rounding can stray by a few ulps."""
    return min(max(total, 0.0), float(bid * saved))


def dfs_payments(
    plan: Plan, *, reserve: int, owners: list[str] | None = None
) -> tuple[list[float], list[int]]:
    """Charges and savings of every request, by position in the order.

    The same sums as ``dfs_charge``, taken node by node: the requests of a block are a contiguous
    run of the order (the blocks before it, in service order, hold the positions before it), so
    each node's sorted siblings are looked up by all its requests in turn (``_node_charges``,
    ``_block_charges``).

    Each request's effective bid is read off its own block as the walk meets it (the planner's,
    reserve applied), so the blocks of several requests are charged after the walk, once the
    bids of all their requests are known; what each request pays at its ancestors' nodes is
    kept apart (``ahead``) and added first, as the walk from the root would.

    ``owners`` (each request's tenant, by position; "" for none): the charges are tenant-level
    (``TenantCharges``): what the standard charge bills for the request's own tenant's other
    requests is taken off (``_Own``). Those sums need every bid from the start, so the blocks
    are charged as the walk meets them.
    """
    key, _, inside, root = _dfs(plan)
    n = len(plan.order)
    pay = [0.0] * n
    saved = [0] * n
    own: _Own | None
    if owners is None:
        bids = [0] * n
        own = None
        ahead = [0.0] * n
    else:
        bids = effective_bids(plan.order, reserve)
        # What the standard charge bills for a request counts the others' credits with their
        # bids (aging.py): so does what the tenant-level charge takes off.
        own = _Own(owners, [b + e.credit for b, e in zip(bids, plan.order, strict=True)])
        ahead = pay
    later: list[_Later] = []
    stack: list[tuple[Node, int]] = [(root, 0)]  # a node and its first position
    while stack:
        x, start = stack.pop()
        blocks = inside[x]
        if len(blocks) == 1:  # nothing to pass here: on to its one block
            inner = blocks[0][INNER]
            if type(inner) is Node:
                stack.append((inner, start))
            else:
                bids[start] = blocks[0][BSUM] - inner.credit
            continue
        _node_charges(blocks, start, key, reserve, bids, pay, saved, own, stack, later)
    size_of, counts_cached = key.size, key.counts_cached
    boosted = key.cached_boost != 1.0
    for blocks, sums, j, first in later:
        _, _, bn, _, work, inner = blocks[j]
        size = size_of(bn, work, boosted and counts_cached(inner))
        _block_charges(blocks, sums, j, first, size, bids, reserve, ahead, saved)
    if ahead is not pay:
        pay = list(map(add, ahead, pay))
    if own is not None:
        own.take_off(pay, saved, reserve)
    # The charge lies in [0, bid x saved]; prefix-sum rounding can stray by a few ulps.
    for k, amount in enumerate(pay):
        if amount:
            top = float(bids[k] * saved[k])
            pay[k] = 0.0 if amount < 0.0 else (top if amount > top else amount)
    return pay, saved


def _node_charges(
    blocks: list[Block],
    start: int,
    key: BlockKey,
    reserve: int,
    bids: list[int],
    pay: list[float],
    saved: list[int],
    own: _Own | None,
    stack: list[tuple[Node, int]],
    later: list[_Later],
) -> None:
    """The walk at one node with several blocks, the first from position ``start``: each block
    of one request charged for the siblings it passes, its bid filed in ``bids``; each block of
    a node pushed on ``stack`` to walk, and, if it holds bids and is not last, charged now
    (tenant-level, ``own``) or kept in ``later`` for once all its bids are known."""
    size_of, counts_cached = key.size, key.counts_cached
    boosted = key.cached_boost != 1.0  # else no block counts as cached: not asked per block
    last = len(blocks) - 1
    sums = nks, pw, pwk = _sibling_sums(blocks)
    starts = [] if own is None else _Own.starts(start, blocks)
    zero = bisect_left(nks, 0.0)  # blocks from here on have key 0
    for j, block in enumerate(blocks):
        _, tie, bn, bsum, work, inner = block
        first = start
        start += bn
        if type(inner) is Node:
            stack.append((inner, first))
            if j < last and bsum > 0:  # the last block, or one without bids, passes nothing
                if own is None:
                    later.append((blocks, sums, j, first))
                else:
                    size = size_of(bn, work, boosted and counts_cached(inner))
                    _block_charges(
                        blocks, sums, j, first, size, bids, reserve, pay, saved, own, starts
                    )
            continue
        credit = inner.credit  # its age credit: in its key, not its bid (aging.py)
        bids[first] = b = bsum - credit
        if j == last or b <= 0:
            continue
        size = size_of(1, work, boosted and counts_cached(inner))
        if size <= 0:  # its key is infinite whatever its bid
            continue
        # A single request: at bid 0 its key is its credit's, 0 without one.
        lo = j + 1
        if credit:
            hi = bisect_left(blocks, (-(credit / size), tie), lo)
        else:
            hi = last + 1 if zero > last else bisect_left(blocks, (0.0, tie), max(lo, zero))
        if hi <= lo:
            continue
        pay[first] += _passed(nks, pw, pwk, lo, hi, size, credit, reserve)
        saved[first] += pw[hi] - pw[lo]
        if own is not None:
            own.passed(first, first, 1, work, lo, hi, pw, starts)


def _block_charges(
    blocks: list[Block],
    sums: Sums,
    j: int,
    first: int,
    size: float,
    bids: list[int],
    reserve: int,
    pay: list[float],
    saved: list[int],
    own: _Own | None = None,
    starts: Sequence[int] = (),
) -> None:
    """What each request of ``blocks[j]``, a block of several requests from position ``first``
    whose key divides by ``size``, pays for passing the siblings after it, added to ``pay``
    and ``saved`` (and, tenant-level, to ``own``; ``starts``: the blocks' first positions).

    A request passes the next sibling only if, with its bid at 0, its block's key would still be
    at least that sibling's: bids below ``floor`` cannot, and are skipped without a lookup.
    """
    if size <= 0:
        return
    nks, pw, pwk = sums
    _, tie, bn, bsum, _, _ = blocks[j]
    lo = j + 1
    nxt = blocks[lo]
    # others / size <= next key  <=>  bid >= bsum - size x next key (up to rounding).
    floor = bsum + size * nks[lo]
    floor -= 1 + abs(floor) * 1e-9
    for k in range(first, first + bn):
        b = bids[k]
        if b <= 0 or b < floor:
            continue
        others = bsum - b
        key0 = (-(others / size), tie)
        if key0 < nxt:
            continue
        hi = bisect_left(blocks, key0, lo)
        pay[k] += _passed(nks, pw, pwk, lo, hi, size, others, reserve)
        saved[k] += pw[hi] - pw[lo]
        if own is not None:
            own.passed(k, first, bn, blocks[j][WORK], lo, hi, pw, starts)


class _Own:
    """What a request's standard charge bills for its own tenant's other requests, in bid ticks
    x tokens: the tenant-level charge (docs/mechanism.md, "Tenant-level charges"; ``charge_scope``)
    takes it off.

    Passing sibling blocks at a node (bidding b instead of 0) delays every request in them by the
    work of the request's block, and brings forward the others of its block by the passed work.
    Of these, the standard charge bills the delay and credits the gain for every other request;
    the tenant's share is the passed blocks' own-tenant bids x the block's work, less the block's
    other own-tenant bids x the passed work. A block's requests are a contiguous run of the order,
    so both sums are differences of one prefix sum of the tenant's bids over the order.
    """

    def __init__(self, owners: list[str], bids: list[int]) -> None:
        self.owners = owners
        self.bids = bids
        self.amounts = [0.0] * len(bids)
        self._prefix: dict[str, list[int]] = {}

    def _sums(self, tenant: str) -> list[int]:
        got = self._prefix.get(tenant)
        if got is None:
            mine = (b if o == tenant else 0 for b, o in zip(self.bids, self.owners, strict=True))
            got = self._prefix[tenant] = [0, *accumulate(mine)]
        return got

    @staticmethod
    def starts(start: int, blocks: list[Block]) -> list[int]:
        """The first positions of a node's blocks (and the one after the last), from ``start``."""
        return list(accumulate((b[REQUESTS] for b in blocks), initial=start))

    def passed(
        self,
        k: int,
        first: int,
        bn: int,
        work: int,
        lo: int,
        hi: int,
        pw: list[int],
        starts: Sequence[int],
    ) -> None:
        """Request ``k`` of the block at ``first`` (``bn`` requests, ``work``) passes the blocks
        ``lo..hi-1`` of a node whose blocks start at ``starts``."""
        tenant = self.owners[k]
        if not tenant:
            return
        p = self._sums(tenant)
        delayed = p[starts[hi]] - p[starts[lo]]  # own bids in the passed blocks
        along = p[first + bn] - p[first] - self.bids[k]  # own bids beside it in its block
        self.amounts[k] += work * delayed - along * (pw[hi] - pw[lo])

    def take_off(self, pay: list[float], saved: list[int], reserve: int) -> None:
        """The tenant-level charges: each standard charge in ``pay`` less what it bills for its
        tenant's own requests (``amounts``), at least reserve x saved time (the caller caps
        them at bid x saved time, as every charge)."""
        for k, amount in enumerate(self.amounts):
            if amount:
                pay[k] = max(pay[k] - amount, float(reserve * saved[k]))


class DfsCharges:
    """Charges for the DFS auctions: one request from its node up, or all node by node.

    Keeps the sibling sums of the nodes that single charges have looked at, for the round.
    """

    def __init__(self, plan: Plan, cums_upto: CumsUpto, reserve: int) -> None:
        self.plan = plan
        self.reserve = reserve
        self._sums: dict[Node, Sums] = {}

    def _sums_at(self, x: Node) -> Sums:
        got = self._sums.get(x)
        if got is None:
            _, _, inside, _ = _dfs(self.plan)
            got = self._sums[x] = _sibling_sums(inside[x])
        return got

    def charge(self, entry: Entry) -> tuple[float, int]:
        """Priority charge and planned saving of one request (``dfs_charge``)."""
        return dfs_charge(self.plan, entry, reserve=self.reserve, sums=self._sums_at)

    def every(self) -> list[float]:
        """Priority charge of every request, by position in the order (``dfs_payments``)."""
        return dfs_payments(self.plan, reserve=self.reserve)[0]


class TenantCharges(DfsCharges):
    """Tenant-level charges for the DFS auctions (the market's ``charge_scope = "tenant"``): a
    request is not billed for the delay it imposes on its own tenant's other requests, nor
    credited for what they gain with it (its tenant bears both in its own waiting cost). The
    standard charge less that (``_Own``), never below reserve x saved time nor above bid x saved
    time. A request with no tenant (owner "") is charged as usual.

    Every request's charge comes from one pass over the plan (``dfs_payments`` with owners), made
    the first time any is asked for.
    """

    def __init__(self, plan: Plan, cums_upto: CumsUpto, reserve: int) -> None:
        super().__init__(plan, cums_upto, reserve)
        self._all: tuple[list[float], list[int]] | None = None
        self._positions: dict[str, int] | None = None

    def _every(self) -> tuple[list[float], list[int]]:
        if self._all is None:
            owners = [e.req.owner for e in self.plan.order]
            self._all = dfs_payments(self.plan, reserve=self.reserve, owners=owners)
        return self._all

    def charge(self, entry: Entry) -> tuple[float, int]:
        if self._positions is None:
            self._positions = {e.req.id: i for i, e in enumerate(self.plan.order)}
        pay, saved = self._every()
        k = self._positions[entry.req.id]
        return pay[k], saved[k]

    def every(self) -> list[float]:
        return self._every()[0]


class FlatCharges:
    """Charges for highest-bid, from the plan's order, effective bids and cumulative work.

    ``cums_upto(k)`` gives the cumulative work of the first k requests (it may work it out on
    demand); a request's charge needs it up to where the request would stand at bid 0.
    """

    def __init__(self, plan: Plan, cums_upto: CumsUpto, reserve: int) -> None:
        self.order = plan.order
        self.bids = effective_bids(plan.order, reserve)
        # The plan's sort keys: (-effective bid, tie), ascending.
        self.keys = [(-b, e.tie) for b, e in zip(self.bids, self.order, strict=True)]
        self.cums_upto = cums_upto
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

    def _values_upto(self, k: int) -> list[int]:
        values = self.values
        if len(values) <= k:
            cums = self.cums_upto(k)
            reserve = self.reserve
            bids = self.bids
            for m in range(len(values) - 1, k):
                b = bids[m]
                prev = cums[m - 1] if m else 0
                values.append(values[-1] + (cums[m] - prev) * (b if b > reserve else reserve))
        return values

    def charge_at(self, p: int) -> tuple[float, int]:
        """Priority charge and planned saving of the request at position ``p`` of the order."""
        b = self.bids[p]
        if b <= 0:
            return 0.0, 0
        q = bisect_left(self.keys, (0, self.order[p].tie), p + 1)
        if q <= p + 1:
            return 0.0, 0
        values = self._values_upto(q)
        cums = self.cums_upto(q)
        return values[q] - values[p + 1], cums[q - 1] - cums[p]
