"""The six ordering policies of DESIGN.md 4.2, as a registry from name to ``Policy``.

A ``Policy`` says in one place what the rest of the mechanism and the engines ask about a policy:
whether its order uses bids (and so charges for priority), whether it is a DFS order of the
request tree, the key its sibling blocks go by, the planner that orders a round, and how the
round's priority charges are worked out. ``POLICY[name]`` looks one up; ``policy_checked`` checks
a name from outside.

A planner walks the request tree and returns the service order, with the cumulative work
(tokens) at which each request completes when it has it at hand. DFS policies serve every subtree
as one contiguous block: at each node the blocks (child subtrees and the requests that end there)
go in order of a key, ties to the earliest arrival, then the smallest id. The bid-blind baselines
order the requests directly and leave the work of each to be found on demand by marking the nodes
its prefix needs (each is computed once, by the first request that needs it).

The loops are written out by hand, leaves (one request, no children) taking a short path: a round
visits every node, and most nodes are leaves.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

from .payments import ChargeRule, DfsCharges, FlatCharges
from .tree import INF, Entry, Node, RequestTree

# The service order, and the cumulative work (tokens) at each completion, or None when the
# Clearing is to work it out itself, on demand, by marking the nodes each request needs.
Plan = tuple[list[Entry], list[int] | None]

# Planners take the policy, the reserve in bid ticks and the overhead tokens per request; the
# bid-using ones leave each request's effective bid, in ticks, in its entry's ``bsum``.
Planner = Callable[[RequestTree, "Policy", int, int], Plan]


@dataclass(frozen=True, slots=True)
class BlockKey:
    """What a DFS auction orders sibling blocks by, higher first: the block's sum of effective
    bids over its size, the number of its requests or its work (uncached tokens and overheads,
    the edge into it included)."""

    name: str
    per_work: bool  # size = work (bid density, Smith's rule) rather than number of requests

    def __call__(self, bsum: float, n: int, work: int) -> float:
        """The key of a block with ``n`` requests, bid sum ``bsum`` (any unit) and ``work``.

        A block that needs no work costs the others nothing, so by bid density it goes first
        whatever its bid.
        """
        if not self.per_work:
            return bsum / n
        return bsum / work if work > 0 else INF


AVERAGE_BID = BlockKey("average bid", per_work=False)
BID_DENSITY = BlockKey("bid density", per_work=True)


@dataclass(frozen=True, slots=True)
class Policy:
    """One ordering policy: its name and the rules the mechanism and the engines ask about."""

    name: str
    uses_bids: bool  # the order depends on bids, so admitted requests pay for priority
    dfs: bool  # every subtree of the request tree served as one block (DESIGN.md 4.2)
    block_key: BlockKey | None  # what sibling blocks go by, for the DFS auctions
    planner: Planner  # orders one round
    charges: ChargeRule | None  # works out the round's priority charges (payments.py); None: free

    def __str__(self) -> str:
        return self.name


_by_key = attrgetter("nk", "tie")
_by_tie = attrgetter("tie")


def _internal_nodes(root: Node) -> list[Node]:
    """The nodes with children, parents before children."""
    out = [root]
    i = 0
    while i < len(out):
        for c in out[i].children.values():
            if c.children:
                out.append(c)
        i += 1
    return out


def _auction_blocks(
    x: Node, density: bool, reserve: int, overhead: int
) -> tuple[list, int, int, int, tuple | None]:
    """The requests ending at ``x`` as blocks: (blocks, n, bid sum, work, tie)."""
    bsum = 0
    tie = None
    blocks: list = []
    for e in x.reqs.values():
        b = e.ticks
        if b < reserve:
            b = 0
        e.bsum, e.work = b, overhead
        if density:
            e.nk = -(b / overhead) if overhead else -INF
        else:
            e.nk = -b
        if tie is None or e.tie < tie:
            tie = e.tie
        bsum += b
        blocks.append(e)
    return blocks, len(blocks), bsum, len(blocks) * overhead, tie


def _close_block(x: Node, blocks: list, n: int, bsum: int, work: int, tie, density: bool) -> None:
    """Store a node's totals as a block (its edge's uncached tokens added) and sort its blocks."""
    work += x.ew
    x.n, x.bsum, x.work, x.tie = n, bsum, work, tie
    if density:
        x.nk = -(bsum / work) if work else -INF
    elif n:
        x.nk = -(bsum / n)
    if len(blocks) > 1:
        blocks.sort(key=_by_key)
    x.blocks = blocks
    x.only = None
    x.sums = None


def _plan_dfs_auction(tree: RequestTree, policy: Policy, reserve: int, overhead: int) -> Plan:
    """DFS order with sibling blocks by the policy's ``BlockKey`` (average bid or bid density).

    The key is written out inline, as ``-key`` in ``nk``, so that ascending sorts go first.
    """
    density = policy.block_key.per_work
    for x in reversed(_internal_nodes(tree.root)):
        blocks, n, bsum, work, tie = _auction_blocks(x, density, reserve, overhead)
        for c in x.children.values():
            if not c.children:
                reqs = c.reqs
                if len(reqs) == 1:
                    # A leaf holding one request, the common case: the request is its only block.
                    for e in reqs.values():
                        b = e.ticks
                        if b < reserve:
                            b = 0
                        e.bsum, e.work = b, overhead
                        cw = c.ew + overhead
                        c.only, c.n, c.bsum, c.work, c.tie = e, 1, b, cw, e.tie
                        if density:
                            c.nk = -(b / cw) if cw else -INF
                        else:
                            c.nk = -b
                else:
                    _close_block(c, *_auction_blocks(c, density, reserve, overhead), density)
            n += c.n
            bsum += c.bsum
            work += c.work
            if tie is None or c.tie < tie:
                tie = c.tie
            blocks.append(c)
        _close_block(x, blocks, n, bsum, work, tie, density)
    return _emit_dfs(tree.root, overhead)


def _emit_dfs(root: Node, overhead: int) -> Plan:
    """Walk the sorted blocks depth-first; an edge's uncached tokens are paid on entering it.

    Records where each subtree's requests start in the order (``first``), for the payments.
    """
    order: list[Entry] = []
    cums: list[int] = []
    cum = 0
    root.first = 0
    stack = list(reversed(root.blocks)) if root.only is None else [root.only]
    while stack:
        b = stack.pop()
        if type(b) is Entry:
            b.first = len(order)
            cum += overhead
            order.append(b)
            cums.append(cum)
            continue
        b.first = len(order)
        cum += b.ew
        e = b.only
        if e is not None:
            e.first = b.first
            cum += overhead
            order.append(e)
            cums.append(cum)
            continue
        blocks = b.blocks
        if len(blocks) == 1:
            stack.append(blocks[0])
        else:
            stack.extend(reversed(blocks))
    return order, cums


def _plan_fcfs(tree: RequestTree, policy: Policy, reserve: int, overhead: int) -> Plan:
    """First come, first served."""
    return sorted(tree.entries.values(), key=_by_tie), None


def _plan_highest_bid(tree: RequestTree, policy: Policy, reserve: int, overhead: int) -> Plan:
    """Highest effective bid first, then arrival (SGLang's priority scheduling, priority = bid).

    The tree keeps its requests by bid; bids under the reserve count as 0 and join the zero
    bids at the end, by arrival.
    """
    keys, by_bid = tree.by_bid()
    cut = bisect_left(keys, (1 - reserve,)) if reserve > 0 else len(keys)  # ticks < reserve
    entries = by_bid[:cut]
    for e in entries:
        e.bsum = e.ticks
        e.nk = -e.ticks
    if cut < len(by_bid):
        rest = sorted(by_bid[cut:], key=_by_tie)
        for e in rest:
            e.bsum = 0
            e.nk = 0
        entries.extend(rest)
    return entries, None


# SGLang's in-batch prefix caching check for lpm (its defaults; both are environment variables
# there): a request with at most CHECK cached tokens that shares at least DEPRIORITIZE tokens with
# an earlier such request in the queue waits behind everything else, so that the shared prefix is
# computed once (by the earlier request) instead of twice in the same batch.
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32


def _plan_lpm(tree: RequestTree, policy: Policy, reserve: int, overhead: int) -> Plan:
    """Longest cached prefix first, SGLang's lpm (without its fallback to fcfs on long queues).

    The queue is visited in arrival order for the in-batch check; the shared prefix with the
    earlier requests checked is the end of the deepest node on the request's path that one of
    them passes through (paths only part at nodes).
    """
    tree.stamp = stamp = tree.stamp + 1
    root = tree.root
    root.mark = stamp
    keyed = []
    for e in sorted(tree.entries.values(), key=_by_tie):
        cached = e.req.cached_len
        deprioritized = False
        if cached <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
            x = e.node
            while x.mark != stamp:
                x = x.parent
            if x.end >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                deprioritized = True
            else:
                x = e.node
                while x.mark != stamp:
                    x.mark = stamp
                    x = x.parent
        keyed.append(((1, 0, e.tie) if deprioritized else (0, -cached, e.tie), e))
    keyed.sort(key=lambda ke: ke[0])
    return [e for _, e in keyed], None


def _plan_dfs_weight(tree: RequestTree, policy: Policy, reserve: int, overhead: int) -> Plan:
    """SGLang's dfs-weight: DFS over the tree of *cached* prefixes, heavier subtrees first.

    A request hangs at the end of its cached prefix (its anchor). At each point of that tree the
    child subtrees go first, by the number of requests anchored in them (descending), then the
    requests anchored at the point itself. Unlike the DFS auctions, requests that share only an
    uncached prefix are not grouped. Ties: earliest arrival, then id (SGLang keeps its radix
    tree's insertion order there).
    """
    nodes = tree.nodes()
    anchored: dict[Node, list[Entry]] = {}
    root = tree.root
    for e in tree.entries.values():
        c = e.req.cached_len
        x = e.node
        while x is not root and x.start >= c:
            x = x.parent
        anchored.setdefault(x, []).append(e)
    for x in reversed(nodes):
        own = anchored.get(x, ())
        n = len(own)
        tie = min((e.tie for e in own), default=None)
        live = []
        for c in x.children.values():
            if c.n:
                n += c.n
                if tie is None or c.tie < tie:
                    tie = c.tie
                live.append(c)
        live.sort(key=lambda c: (-c.n, c.tie))
        # Anchors inside this node's edge form a chain: the deeper ones are served first.
        own = sorted(own, key=lambda e: (-e.req.cached_len, e.tie))
        x.n, x.tie, x.blocks = n, tie, live + own
    order: list[Entry] = []
    stack = list(reversed(root.blocks))
    while stack:
        b = stack.pop()
        if type(b) is Entry:
            order.append(b)
        else:
            stack.extend(reversed(b.blocks))
    return order, None


# The registry, in the order of DESIGN.md 4.2. dfs-weight walks the tree of cached prefixes, not
# the request tree, so it is not ``dfs`` here.
# fmt: off
REGISTRY: tuple[Policy, ...] = (
    #      name                   uses_bids  dfs    block_key    planner             charges
    Policy("fcfs",                False,     False, None,        _plan_fcfs,         None),
    Policy("lpm",                 False,     False, None,        _plan_lpm,          None),
    Policy("dfs-weight",          False,     False, None,        _plan_dfs_weight,   None),
    Policy("highest-bid",         True,      False, None,        _plan_highest_bid,  FlatCharges),
    Policy("dfs-auction",         True,      True,  AVERAGE_BID, _plan_dfs_auction,  DfsCharges),
    Policy("dfs-auction-density", True,      True,  BID_DENSITY, _plan_dfs_auction,  DfsCharges),
)
# fmt: on

POLICY: dict[str, Policy] = {p.name: p for p in REGISTRY}
POLICIES: tuple[str, ...] = tuple(POLICY)

# Policies whose order depends on bids, and so charge for priority.
BID_POLICIES = frozenset(p.name for p in REGISTRY if p.uses_bids)
# Policies that order blocks of the full request tree by a bid key.
DFS_AUCTIONS = frozenset(p.name for p in REGISTRY if p.dfs and p.block_key is not None)


def policy_checked(policy: object) -> str:
    """Return the policy name, or raise ValueError naming it if it is unknown."""
    if not isinstance(policy, str) or policy not in POLICY:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    return policy


def block_key(policy: str, bsum: float, n: int, work: int) -> float:
    """The key the DFS auction ``policy`` orders sibling blocks by, higher first (``BlockKey``)."""
    key = POLICY[policy_checked(policy)].block_key
    if key is None:
        raise ValueError(f"policy {policy!r} does not order blocks by a key")
    return key(bsum, n, work)
