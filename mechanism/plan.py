"""A round's plan: the service order, the blocks a DFS order is made of, and the key they go by.

A planner (planners in policies.py's registry) returns a ``Plan``; the round's ``Clearing`` keeps
it, and the charge rules (payments.py) read it. A Clearing stays valid as long as the tree has not
changed, whatever else was cleared since: what the DFS auctions keep in the nodes across rounds
depends only on the subtree and the planner's settings, and each setting keeps its own
(``RequestTree.plan_token``), so rounds with other settings do not overwrite it and rounds with
the same ones find the same.

A DFS order is a tree of blocks: at each node, its child subtrees and the requests that end there,
in service order, each a ``Block``. Ties are unique among siblings (their requests are disjoint),
so sibling blocks sort as tuples, the comparison never going past ``tie``, and a ``(nk, tie)``
pair bisects a node's blocks. dfs-auction-kv-split contracts the tree first: a subtree whose edge
is fully cached (``Node.fully_cached``) is no block of its own; its blocks sit among its parent's,
so ``inside[parent]`` holds them, and such a node is never a block's ``inner``.

What sibling blocks go by is the policy's ``BlockKey``: the one statement of the key, which the
planner, the charges and the readers of the registry all call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

from .tree import INF, Entry, Node

# A block is a plain tuple of six fields, read by these names (``block[INNER]``) or unpacked in
# this order:
#
# - ``NK``: minus the block's key (BlockKey.nk), so that ascending sorts go first,
# - ``TIE``: (arrival, id) of its earliest request,
# - ``REQUESTS``: how many requests it holds; ``BSUM``: their effective bids, in bid ticks
#   (requests.BID_SCALE),
# - ``WORK``: its uncached tokens and overheads, the edge into it included (tokens),
# - ``INNER``: for a block of one request (a request ending at a node with other blocks, or the
#   only request of a leaf), its ``Entry``; else the ``Node`` whose blocks are ``inside[node]``.
#
# Not a NamedTuple: a round makes one per request and sorts them, and a tuple subclass is made,
# sorted and indexed by slower paths than a tuple (a tenth of a full round, measured).
Block = tuple[float, tuple[float, str], int, int, int, Node | Entry]
NK: Final = 0
TIE: Final = 1
REQUESTS: Final = 2
BSUM: Final = 3
WORK: Final = 4
INNER: Final = 5

_Read = TypeVar("_Read", covariant=True)


class NodeLookup(Protocol[_Read]):
    """What a plan keeps per node, read as ``lookup[node]``: a dict, or a view of the state the
    planner keeps in the nodes (dfs_auction's views)."""

    def __getitem__(self, node: Node, /) -> _Read: ...


@dataclass(frozen=True, slots=True)
class BlockKey:
    """What a DFS auction orders sibling blocks by, higher first: the block's sum of effective
    bids over its size, the number of its requests or its work (uncached tokens and overheads,
    the edge into it included)."""

    name: str
    per_work: bool  # size = work (bid density, Smith's rule) rather than number of requests
    # A block that counts as cached (``block_cached``: its edge, the tokens into it from its
    # parent, is already partly in the KV cache) counts its size divided by this: 1 for the
    # plain keys. A request that ends at a node with other blocks has no edge of its own.
    cached_boost: float = 1.0
    # Fully cached subtrees are no blocks of their own: their blocks go among their parents'
    # (dfs-auction-kv-split; Node.fully_cached).
    split_cached: bool = False

    def size(self, n: int, work: int, cached: bool = False) -> float:
        """What the key divides a block's bid sum by: its ``work`` (tokens) or its ``n``
        requests, over ``cached_boost`` when it counts as ``cached``."""
        size = work if self.per_work else n
        return size / self.cached_boost if cached else size

    def nk(self, bsum: float, n: int, work: int, cached: bool = False) -> float:
        """Minus the key of a block with ``n`` requests, bid sum ``bsum`` (any unit) and
        ``work``, as a ``Block`` keeps it: ``bsum`` over the block's ``size``; ``cached``: it
        counts as cached (``counts_cached``).

        A block of size zero costs the others nothing, so it goes first whatever its bids: its
        key is infinite. Under bid density that is a block with no work (cached, no overheads);
        by number of requests, only the root of an empty tree, which is no one's sibling.
        """
        # ``size`` written out: the planner calls this for every request of a round, and a
        # second call would cost more than the rule (the tests hold the two together).
        size: float = work if self.per_work else n
        if cached:
            size = size / self.cached_boost
        return -(bsum / size) if size > 0 else -INF

    def __call__(self, bsum: float, n: int, work: int, cached: bool = False) -> float:
        """The key of a block (``nk``, the other way round)."""
        return -self.nk(bsum, n, work, cached)

    def counts_cached(self, inner: Node | Entry) -> bool:
        """Whether the block of ``inner`` (a Block's) counts its size divided by the boost."""
        return self.cached_boost != 1.0 and block_cached(inner, self.split_cached)


def block_cached(inner: Node | Entry, split: bool) -> bool:
    """Whether the KV auctions' boost (BlockKey.cached_boost) applies to a block, given its
    ``inner``: its edge (the tokens into it from its parent) is partly in the KV cache, or, with
    ``split``, it is a block of a fully cached subtree (``Node.fully_cached``), so it sits right
    under a cached prefix. A request that ends at a node with other blocks has no edge of its
    own; the one request of a leaf has the leaf's."""
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


class Plan:
    """The plan of one round, as its planner leaves it."""

    __slots__ = ("order", "overhead", "cums", "blocks", "inside", "root", "handles", "key")

    def __init__(
        self,
        order: list[Entry],
        overhead: int,
        cums: list[int] | None = None,
        *,
        blocks: NodeLookup[Block] | None = None,
        inside: NodeLookup[list[Block]] | None = None,
        root: Node | None = None,
        handles: list[object] | None = None,
        key: BlockKey | None = None,
    ) -> None:
        self.order = order  # the service order
        self.overhead = overhead  # tokens of work per request besides its prompt
        # Cumulative work (tokens) at each completion, or None: the Clearing works it out on
        # demand, by marking the nodes each request needs (bid-blind orders).
        self.cums = cums
        # DFS orders: the block of each node that holds several blocks. A block of one request
        # is found in its node's (or its leaf's parent's) ``inside`` by its key, so that a round
        # files nothing per request. Read as ``blocks[node]`` (NodeLookup).
        self.blocks = blocks
        # DFS orders: the blocks at each node that holds several (and at the root), in order;
        # read as ``inside[node]`` likewise.
        self.inside = inside
        self.root = root  # DFS orders: the tree's root, where the blocks start
        # The engine's handles on the requests of ``order`` (Entry.handle), in the same order,
        # when the planner keeps them (the DFS auctions); None: read off the entries.
        self.handles = handles
        # DFS orders: the key their blocks go by; payments.py reads it.
        self.key = key
