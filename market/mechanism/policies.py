"""The six ordering policies of DESIGN.md 4.2, as a registry from name to ``Policy``.

A ``Policy`` says in one place what the rest of the mechanism and the engines ask about a policy:
whether its order uses bids (and so charges for priority), whether it is a DFS order of the
request tree, the key its sibling blocks go by, the planner that orders a round, and how the
round's priority charges are worked out. ``POLICY[name]`` looks one up; ``policy_checked`` checks
a name from outside.

A planner walks the request tree and returns the round's ``Plan`` (plan.py): the service order,
with the cumulative work (tokens) at which each request completes when it has it at hand, and
what the round's charges need. It writes nothing into the tree, so that clearings of one tree do
not disturb each other. DFS policies serve every subtree as one contiguous block: at each node
the blocks (child subtrees and the requests that end there) go in order of a key, ties to the
earliest arrival, then the smallest id. The bid-blind baselines order the requests directly and
leave the work of each to be found on demand by marking the nodes its prefix needs (each is
computed once, by the first request that needs it).

The loops are written out by hand, leaves (one request, no children) taking a short path: a round
visits every node, and most nodes are leaves.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

from .payments import ChargeRule, DfsCharges, FlatCharges
from .plan import Block, Plan
from .tree import INF, Entry, Node, RequestTree

# Planners take the policy, the reserve in bid ticks and the overhead tokens per request, and
# return the round's Plan (plan.py); they read the tree and write nothing into it.
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


_by_tie = attrgetter("tie")


def _shared_nodes(root: Node) -> list[Node]:
    """The root and the nodes holding more than one request (so several blocks), parents before
    children. The others are leaves holding one request."""
    out = [root]
    i = 0
    while i < len(out):
        for c in out[i].children.values():
            if c.size > 1:
                out.append(c)
        i += 1
    return out


def _auction_blocks(
    x: Node, density: bool, reserve: int, overhead: int, met: list[Entry]
) -> tuple[list[Block], int, int, int, tuple | None]:
    """The requests ending at ``x`` as blocks: (blocks, n, bid sum, work, tie)."""
    bsum = 0
    tie = None
    blocks: list[Block] = []
    for e in x.reqs.values():
        b = e.ticks
        if b < reserve:
            b = 0
        if density:
            nk = -(b / overhead) if overhead else -INF
        else:
            nk = -b
        t = e.tie
        if tie is None or t < tie:
            tie = t
        bsum += b
        blocks.append((nk, t, 1, b, overhead, len(met)))
        met.append(e)
    return blocks, len(blocks), bsum, len(blocks) * overhead, tie


def _close_block(
    x: Node,
    blocks: list[Block],
    n: int,
    bsum: int,
    work: int,
    tie,
    density: bool,
    blocks_of: dict[Node, Block],
    inside: dict[Node, list[Block]],
) -> Block:
    """A node's block from its totals (its edge's uncached tokens added); sorts its blocks."""
    work += x.ew
    if density:
        nk = -(bsum / work) if work else -INF
    else:
        nk = -(bsum / n) if n else 0.0  # n is 0 only at the root of an empty tree
    if len(blocks) > 1:
        blocks.sort()  # plain tuple order: (nk, tie), ties being unique among siblings
    block = (nk, tie, n, bsum, work, x)
    blocks_of[x] = block
    inside[x] = blocks
    return block


def _plan_dfs_auction(tree: RequestTree, policy: Policy, reserve: int, overhead: int) -> Plan:
    """DFS order with sibling blocks by the policy's ``BlockKey`` (average bid or bid density).

    The key is written out inline, as ``-key`` in a block's ``nk``, so that ascending sorts go
    first. Children are closed before their parents (reversed breadth-first order).
    """
    density = policy.block_key.per_work
    blocks_of: dict[Node, Block] = {}
    inside: dict[Node, list[Block]] = {}
    met: list[Entry] = []  # the requests, as the walk meets them; blocks of one refer by index
    for x in reversed(_shared_nodes(tree.root)):
        blocks, n, bsum, work, tie = _auction_blocks(x, density, reserve, overhead, met)
        for c in x.children.values():
            if c.size == 1:
                # A leaf holding one request, the common case: the request is its only block, and
                # the leaf's block is the request's, its edge included (payments.request_block
                # finds it again by the same key).
                for e in c.reqs.values():
                    b = e.ticks
                    if b < reserve:
                        b = 0
                    cw = c.ew + overhead
                    if density:
                        nk = -(b / cw) if cw else -INF
                    else:
                        nk = -b
                    block = (nk, e.tie, 1, b, cw, len(met))
                    met.append(e)
            else:
                block = blocks_of[c]  # closed already: children come before their parents
            _, ct, cn, cb, cw, _ = block
            n += cn
            bsum += cb
            work += cw
            if tie is None or ct < tie:
                tie = ct
            blocks.append(block)
        _close_block(x, blocks, n, bsum, work, tie, density, blocks_of, inside)
    order, cums = _emit_dfs(inside[tree.root], inside, met)
    return Plan(order, overhead, cums, blocks_of, inside, tree.root)


def _emit_dfs(
    top: list[Block], inside: dict[Node, list[Block]], met: list[Entry]
) -> tuple[list[Entry], list[int]]:
    """Walk the sorted blocks depth-first: the order and the cumulative work at each completion.

    A node's edge is paid on entering it; a block of one request adds its work (its leaf's edge,
    if any, and the overhead); it refers to its request by index into ``met``.
    """
    order: list[Entry] = []
    cums: list[int] = []
    cum = 0
    stack = list(reversed(top))
    while stack:
        _, _, _, _, work, inner = stack.pop()
        if type(inner) is int:
            cum += work
            order.append(met[inner])
            cums.append(cum)
            continue
        cum += inner.ew
        blocks = inside[inner]
        if len(blocks) == 1:
            stack.append(blocks[0])
        else:
            stack.extend(reversed(blocks))
    return order, cums


def _plan_fcfs(tree: RequestTree, policy: Policy, reserve: int, overhead: int) -> Plan:
    """First come, first served."""
    return Plan(sorted(tree.entries.values(), key=_by_tie), overhead)


def _plan_highest_bid(tree: RequestTree, policy: Policy, reserve: int, overhead: int) -> Plan:
    """Highest effective bid first, then arrival (SGLang's priority scheduling, priority = bid).

    The tree keeps its requests by bid; bids under the reserve count as 0 and join the zero
    bids at the end, by arrival.
    """
    keys, by_bid = tree.by_bid()
    cut = bisect_left(keys, (1 - reserve,)) if reserve > 0 else len(keys)  # ticks < reserve
    entries = by_bid[:cut]
    if cut < len(by_bid):
        entries.extend(sorted(by_bid[cut:], key=_by_tie))
    return Plan(entries, overhead)


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
    them passes through (paths only part at nodes). Those nodes are kept in a set of the
    planner's own, not in the tree's batch stamps, so that a round never ends an engine's batch.
    """
    passed = {tree.root}
    keyed = []
    for e in sorted(tree.entries.values(), key=_by_tie):
        cached = e.req.cached_len
        deprioritized = False
        if cached <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
            # A leaf holding only this request is on no other request's path: start above it.
            start = e.node.parent if e.node.size == 1 else e.node
            x = start
            while x not in passed:
                x = x.parent
            if x.end >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                deprioritized = True
            else:
                x = start
                while x not in passed:
                    passed.add(x)
                    x = x.parent
        keyed.append(((1, 0, e.tie) if deprioritized else (0, -cached, e.tie), e))
    keyed.sort(key=lambda ke: ke[0])
    return Plan([e for _, e in keyed], overhead)


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
    # The nodes with anchored requests below: (how many, the earliest tie, the blocks in order:
    # child nodes, then requests anchored here).
    below: dict[Node, tuple[int, tuple, list[Node | Entry]]] = {}
    for x in reversed(nodes):
        own = anchored.get(x, ())
        n = len(own)
        tie = min((e.tie for e in own), default=None)
        live = []
        for c in x.children.values():
            sub = below.get(c)
            if sub is not None:
                cn, ct, _ = sub
                n += cn
                if tie is None or ct < tie:
                    tie = ct
                live.append((-cn, ct, c))  # ties are unique: the sort never compares nodes
        if n:
            live.sort()
            # Anchors inside this node's edge form a chain: the deeper ones are served first.
            own = sorted(own, key=lambda e: (-e.req.cached_len, e.tie))
            below[x] = (n, tie, [c for _, _, c in live] + own)
    order: list[Entry] = []
    stack = list(reversed(below[root][2])) if root in below else []
    while stack:
        b = stack.pop()
        if type(b) is Entry:
            order.append(b)
        else:
            stack.extend(reversed(below[b][2]))
    return Plan(order, overhead)


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
