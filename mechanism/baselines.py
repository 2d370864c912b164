"""The planners of the orders the auctions are measured against: SGLang's fcfs, lpm and
dfs-weight, and its priority scheduling with the bid as the priority (highest-bid).

None of them keeps anything across rounds: fcfs and highest-bid read the tree's own indexes
(arrival, bid), lpm and dfs-weight walk the tree. They leave the work of each request to be found
on demand, by marking the nodes its prefix needs (each is computed once, by the first request
that needs it; ``Clearing``). They take their policy (policies.Policy) as every planner does, and
read nothing of it.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import attrgetter

from .plan import Plan
from .tree import Entry, Node, RequestTree

_by_tie = attrgetter("tie")

# SGLang's in-batch prefix caching check for lpm (its defaults; both are environment variables
# there): a request with at most CHECK cached tokens that shares at least DEPRIORITIZE tokens with
# an earlier such request in the queue waits behind everything else, so that the shared prefix is
# computed once (by the earlier request) instead of twice in the same batch.
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32


def plan_fcfs(tree: RequestTree, policy: object, reserve: int, overhead: int) -> Plan:
    """First come, first served."""
    return Plan(sorted(tree.entries.values(), key=_by_tie), overhead)


def plan_highest_bid(tree: RequestTree, policy: object, reserve: int, overhead: int) -> Plan:
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


def plan_lpm(tree: RequestTree, policy: object, reserve: int, overhead: int) -> Plan:
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
                assert x is not None  # the root is passed: the walk stops there at the latest
                x = x.parent
            if x.end >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                deprioritized = True
            else:
                x = start
                while x not in passed:
                    assert x is not None  # as above
                    passed.add(x)
                    x = x.parent
        keyed.append(((1, 0, e.tie) if deprioritized else (0, -cached, e.tie), e))
    keyed.sort(key=lambda ke: ke[0])
    return Plan([e for _, e in keyed], overhead)


def plan_dfs_weight(tree: RequestTree, policy: object, reserve: int, overhead: int) -> Plan:
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
        cached = e.req.cached_len
        x = e.node
        while x is not root and x.start >= cached:
            up = x.parent
            assert up is not None  # only the root has none
            x = up
        anchored.setdefault(x, []).append(e)
    # The nodes with anchored requests below: (how many, the earliest tie, the blocks in order:
    # child nodes, then requests anchored here).
    below: dict[Node, tuple[int, tuple[float, str], list[Node | Entry]]] = {}
    for x in reversed(nodes):
        own = anchored.get(x, ())
        n = len(own)
        tie = min((e.tie for e in own), default=None)
        live: list[tuple[int, tuple[float, str], Node]] = []
        for c in x.children.values():
            sub = below.get(c)
            if sub is not None:
                cn, ct, _ = sub
                n += cn
                if tie is None or ct < tie:
                    tie = ct
                live.append((-cn, ct, c))  # ties are unique: the sort never compares nodes
        if tie is not None:  # something is anchored here or below
            live.sort()
            # Anchors inside this node's edge form a chain: the deeper ones are served first.
            chain = sorted(own, key=lambda e: (-e.req.cached_len, e.tie))
            blocks: list[Node | Entry] = [c for _, _, c in live]
            blocks.extend(chain)
            below[x] = (n, tie, blocks)
    order: list[Entry] = []
    stack = list(reversed(below[root][2])) if root in below else []
    while stack:
        b = stack.pop()
        if type(b) is Entry:
            order.append(b)
        else:
            stack.extend(reversed(below[b][2]))
    return Plan(order, overhead)
