"""The order book: the waiting queue's request tree aggregated by subtree, for one round.

What the console shows and the round records carry: per subtree (down to a given depth) how many
requests wait, the sum and mean of their effective bids, the age credits its requests have earned
by waiting (aging.py: ranked as bid, never paid), their density (bids and credits per uncached
token of the subtree's work: what the DFS auctions rank by), and where the round's order puts the
subtree. No single bid, no request id: the public book is aggregated and anonymous.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter

from .clearing import Clearing
from .plan import BSUM, INNER, REQUESTS, WORK, Block
from .requests import BID_SCALE, effective_bid
from .tree import Entry, Node, RequestTree, entries_below

_credit_of = attrgetter("credit")
_owner_of = attrgetter("owner")


@dataclass(frozen=True, slots=True)
class SubtreeRow:
    """One subtree of the book. Bids in dollars per second, sizes in tokens."""

    prefix: Sequence[int]  # the tokens from the root to the end of the subtree's edge
    depth: int  # 1 for a child of the root
    cached_tokens: int  # of the prefix, already in the KV cache
    requests: int
    bid_sum: float  # effective bids (under the reserve: 0)
    bid_mean: float
    density: float  # (bid_sum + credit_sum) / work, $/s per token (0 when it needs no work)
    work: int  # uncached tokens plus overheads of the whole subtree
    rank: int  # position among its siblings in the round's order
    first_position: int  # position of its first request in the round's order
    # The subtree's node, not compared (a row's figures are what it is).
    node: Node = field(compare=False, repr=False)
    credit_sum: float = 0.0  # the age credits its requests have earned, $/s (never money)
    # Its requests by tenant tag ("" for none), the tags in order.
    owners: dict[str, int] = field(default_factory=dict)


def subtree_book(
    tree: RequestTree, clearing: Clearing, *, max_depth: int = 2, limit: int = 64
) -> list[SubtreeRow]:
    """Subtrees down to ``max_depth``, at most ``limit`` of them, biggest first at each level.

    Works for every policy: for the DFS auctions read off the round's plan (time proportional to
    the blocks shown), for the others recomputed from the tree and the round's order (time
    proportional to the number of nodes), and so for dfs-auction-kv-split, whose plan splits
    fully cached subtrees (a subtree of the book need not be a block there); cached depths are
    the tree's own. Call it before the tree changes.
    """
    clearing._check()
    plan = clearing._plan
    # A split plan (dfs-auction-kv-split) has no block for a fully cached subtree: walked.
    if plan.key is not None and not plan.key.split_cached:
        return _dfs_book(tree, clearing, max_depth, limit)
    return _walked_book(tree, clearing, max_depth, limit)


def _walked_book(
    tree: RequestTree, clearing: Clearing, max_depth: int, limit: int
) -> list[SubtreeRow]:
    """``subtree_book`` for any order: every node's totals from its children's."""
    position = {rid: i for i, rid in enumerate(clearing.order)}
    reserve = clearing._reserve_ticks
    overhead = clearing.overhead_tokens
    stats: dict[Node, tuple[int, int, int, int, int]] = {}  # n, bid ticks, credits, work, first
    for x in reversed(tree.nodes()):
        n = len(x.reqs)
        bsum = csum = 0
        first = len(position)
        for e in x.reqs.values():
            bsum += effective_bid(e.ticks, reserve, 0)
            csum += e.credit
            first = min(first, position[e.req.id])
        work = n * overhead + x.ew
        for c in x.children.values():
            cn, cb, cc, cw, cf = stats[c]
            n, bsum, csum, work = n + cn, bsum + cb, csum + cc, work + cw
            first = min(first, cf)
        stats[x] = (n, bsum, csum, work, first)
    rows: list[SubtreeRow] = []
    level = [(tree.root, 0)]
    while level and len(rows) < limit:
        below = []
        for node, depth in level:
            if depth >= max_depth:
                continue
            children = sorted(node.children.values(), key=lambda c: stats[c][4])
            for rank, c in enumerate(children):
                n, bsum, credit, work, first = stats[c]
                rows.append(_row(c, depth + 1, n, bsum, credit, work, rank, first))
                below.append((c, depth + 1))
        level = below
    rows.sort(key=lambda r: (r.depth, -r.requests, r.first_position))
    return [replace(r, owners=_owners(entries_below(r.node))) for r in rows[:limit]]


def _dfs_book(
    tree: RequestTree, clearing: Clearing, max_depth: int, limit: int
) -> list[SubtreeRow]:
    """``subtree_book`` read off a DFS plan: each subtree is a block of the order, with its
    totals (a block's bid sum holds its credits: they are summed over the subtrees shown and
    taken out), its first position is where its block starts, and its requests are the
    order's from there (no walk of the tree). Time proportional to the blocks of the nodes down
    to ``max_depth`` and the requests of the subtrees shown, not to the queue."""
    inside = clearing._plan.inside
    if inside is None:
        raise ValueError("the round's plan is not a DFS auction's: it keeps no blocks")
    # (depth, -requests, first position, rank, node, block)
    found: list[tuple[int, int, int, int, Node, Block]] = []
    level = [(tree.root, 0, 0)]  # a node, its depth, its block's first position
    while level and len(found) < limit:
        below = []
        for node, depth, start in level:
            if depth >= max_depth:
                continue
            rank = 0
            for block in inside[node]:
                inner = block[INNER]
                n = block[REQUESTS]
                c = inner if type(inner) is Node else inner.node
                if c is not node:  # a child (a request ending at the node itself is not)
                    found.append((depth + 1, -n, start, rank, c, block))
                    rank += 1
                    if type(inner) is Node:
                        below.append((c, depth + 1, start))
                start += n
        level = below
    # Positions are unique at a depth: the tuples compare no further than their third fields.
    found.sort()
    rows = []
    order = clearing._entries  # a block's requests are its stretch of the order
    for depth, _, start, rank, c, block in found[:limit]:
        n, bsum, work = block[REQUESTS], block[BSUM], block[WORK]
        entries = order[start : start + n]
        credit = sum(map(_credit_of, entries))
        owners = _owners(entries)  # the same entries again, while they are in the CPU's cache
        rows.append(_row(c, depth, n, bsum - credit, credit, work, rank, start, owners))
    return rows


def _row(
    c: Node,
    depth: int,
    n: int,
    bsum: int,
    credit: int,
    work: int,
    rank: int,
    first: int,
    owners: dict[str, int] | None = None,
) -> SubtreeRow:
    """A subtree's row, from its totals (effective bids and credits in ticks, work in tokens)."""
    dollars = bsum / BID_SCALE
    credits = credit / BID_SCALE
    return SubtreeRow(
        prefix=c.seq[: c.end],
        depth=depth,
        cached_tokens=min(c.cached, c.end),
        requests=n,
        bid_sum=dollars,
        bid_mean=dollars / n,
        density=(bsum + credit) / BID_SCALE / work if work else 0.0,
        work=work,
        rank=rank,
        first_position=first,
        credit_sum=credits,
        node=c,
        owners={} if owners is None else owners,
    )


def _owners(entries: Iterable[Entry]) -> dict[str, int]:
    """Requests by tenant tag, the tags in order."""
    return dict(sorted(Counter(map(_owner_of, entries)).items()))


@dataclass(frozen=True, slots=True)
class BlockSummary:
    """The top-level subtree a request waited in, as its round saw it ("why this rank")."""

    prefix_tokens: int  # length of the subtree's shared prefix (its edge from the root)
    requests: int
    bid_mean: float  # $/s, effective bids
    density: float  # $/s per uncached token of the subtree's work


def block_of(
    tree: RequestTree,
    clearing: Clearing,
    request_id: str,
    cache: dict[Node, BlockSummary] | None = None,
) -> BlockSummary:
    """The summary of the root's child whose subtree holds ``request_id``, for this round.

    Read from the round's plan for the DFS auctions; for the other policies, time proportional
    to that subtree's size, once per subtree when a ``cache`` dict is passed for the round; call
    it before the tree changes.
    """
    clearing._check()
    x = tree.entries[request_id].node
    while (up := x.parent) is not tree.root:
        assert up is not None  # the walk from a request's node reaches the root first
        x = up
    if cache is not None and x in cache:
        return cache[x]
    totals = clearing.block_totals(x)  # a DFS plan has them; otherwise they are counted here
    if totals is not None:
        n, bsum, work = totals
    else:
        reserve = clearing._reserve_ticks
        overhead = clearing.overhead_tokens
        n = bsum = work = 0
        stack = [x]
        while stack:
            y = stack.pop()
            work += y.ew + overhead * len(y.reqs)
            for e in y.reqs.values():
                n += 1
                bsum += effective_bid(e.ticks, reserve, 0)
            stack.extend(y.children.values())
    dollars = bsum / BID_SCALE
    summary = BlockSummary(x.end, n, dollars / n, dollars / work if work else 0.0)
    if cache is not None:
        cache[x] = summary
    return summary
