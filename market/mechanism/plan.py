"""A round's plan: the service order and the per-round scratch that prices it.

A planner (policies.py) returns a ``Plan``; the round's ``Clearing`` keeps it, and the charge
rules (payments.py) read it. A Clearing stays valid as long as the tree has not changed, whatever
else was cleared since: what the DFS auctions keep in the nodes across rounds depends only on the
subtree and the planner's settings, and each setting keeps its own (``RequestTree.plan_token``),
so rounds with other settings do not overwrite it and rounds with the same ones find the same.

A DFS order is a tree of blocks: at each node, its child subtrees and the requests that end there,
in service order. A block is a plain tuple

    (nk, tie, n, bsum, work, inner)

- ``nk``: minus the policy's key of the block (BlockKey), so that ascending sorts go first,
- ``tie``: (arrival, id) of the block's earliest request,
- ``n``: its requests; ``bsum``: their effective bids, in bid ticks (requests.BID_SCALE),
- ``work``: its uncached tokens and overheads, the edge into it included (tokens),
- ``inner``: for a block of one request (a request ending at a node with other blocks, or the
  only request of a leaf), its ``Entry``; else the ``Node`` whose blocks are ``inside[node]``.

Ties are unique among siblings (their requests are disjoint), so sibling blocks sort as plain
tuples, the comparison never going past ``tie``, and a ``(nk, tie)`` pair bisects a node's blocks.
dfs-auction-kv-split contracts the tree first: a subtree whose edge is fully cached
(``Node.fully_cached``) is no block of its own; its blocks sit among its parent's, so
``inside[parent]`` holds them, and such a node is never a block's ``inner``.

Tuples rather than objects: a tree holds one per request, and a tuple is several times cheaper
to make than an instance. The DFS auctions keep the blocks at each node across rounds
(policies._dfs_states) and work out again only those of nodes that changed.
"""

from __future__ import annotations

from collections.abc import Mapping

from .tree import Entry, Node

Block = tuple[float, tuple, int, int, int, Node | Entry]


class Plan:
    """The plan of one round, as its planner leaves it."""

    __slots__ = (
        "order", "overhead", "cums", "blocks", "inside", "root", "handles", "boost", "split",
    )  # fmt: skip

    def __init__(
        self,
        order: list[Entry],
        overhead: int,
        cums: list[int] | None = None,
        blocks: Mapping[Node, Block] | None = None,
        inside: Mapping[Node, list[Block]] | None = None,
        root: Node | None = None,
        handles: list[object] | None = None,
        boost: float = 1.0,
        split: bool = False,
    ) -> None:
        self.order = order  # the service order
        self.overhead = overhead  # tokens of work per request besides its prompt
        # Cumulative work (tokens) at each completion, or None: the Clearing works it out on
        # demand, by marking the nodes each request needs (bid-blind orders).
        self.cums = cums
        # DFS orders: the block of each node that holds several blocks. A block of one request
        # is found in its node's (or its leaf's parent's) ``inside`` by its key, so that a round
        # files nothing per request. Read as ``blocks[node]``: a dict, or a view of the state the
        # planner keeps in the nodes (policies._MemoView).
        self.blocks = blocks
        # DFS orders: the blocks at each node that holds several (and at the root), in order;
        # read as ``inside[node]`` likewise.
        self.inside = inside
        self.root = root  # DFS orders: the tree's root, where the blocks start
        # The engine's handles on the requests of ``order`` (Entry.handle), in the same order,
        # when the planner keeps them (the DFS auctions); None: read off the entries.
        self.handles = handles
        # DFS orders: a block whose edge is (partly) cached has its key's size divided by this
        # (policies.BlockKey.cached_boost), 1 for the plain keys; payments.py reads it.
        self.boost = boost
        # DFS orders: fully cached subtrees are served as parts of their parents' (dfs-auction-
        # kv-split; policies.BlockKey.split_cached).
        self.split = split


def block_cached(inner: Node | Entry, split: bool) -> bool:
    """Whether the KV auctions' boost (policies.BlockKey.cached_boost) applies to a block,
    given its ``inner``: its edge (the tokens into it from its parent) is partly in the KV
    cache, or, with ``split``, it is a block of a fully cached subtree (``Node.fully_cached``),
    so it sits right under a cached prefix. A request that ends at a node with other blocks has
    no edge of its own; the one request of a leaf has the leaf's."""
    if type(inner) is Node:
        x = inner
    else:
        x = inner.node
        if x.size > 1:
            return split and x.fully_cached()
    if x.edge_cached():
        return True
    if not split:
        return False
    parent = x.parent
    return parent is not None and parent.fully_cached()
