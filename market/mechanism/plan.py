"""A round's plan: the service order and the per-round scratch that prices it.

A planner (policies.py) returns a ``Plan``; the round's ``Clearing`` keeps it, and the charge
rules (payments.py) read it. The request tree holds none of it, so every Clearing of one tree has
its own, and stays valid as long as the tree has not changed, whatever else was cleared since.

A DFS order is a tree of blocks: at each node, its child subtrees and the requests that end there,
in service order. A block is a plain tuple

    (nk, tie, n, bsum, work, inner)

- ``nk``: minus the policy's key of the block (BlockKey), so that ascending sorts go first,
- ``tie``: (arrival, id) of the block's earliest request,
- ``n``: its requests; ``bsum``: their effective bids, in bid ticks (requests.BID_SCALE),
- ``work``: its uncached tokens and overheads, the edge into it included (tokens),
- ``inner``: for a block of one request (a request ending at a node with other blocks, or the
  only request of a leaf), an int, the planner's handle on the request (its tie names it);
  else the ``Node`` whose blocks are ``inside[node]``.

Ties are unique among siblings (their requests are disjoint), so sibling blocks sort as plain
tuples, the comparison never going past ``tie``, and a ``(nk, tie)`` pair bisects a node's blocks.
Tuples rather than objects: a round builds one per request, and a tuple is several times cheaper
to make than an instance. A block of one request holds only numbers and its tie, no reference to
its Entry, so that the garbage collector stops tracking it at its first pass instead of carrying
a round's hundred thousand blocks into its older generations, whose collections walk the whole
heap, tree included.
"""

from __future__ import annotations

from .tree import Entry, Node

Block = tuple[float, tuple, int, int, int, Node | int]


class Plan:
    """The plan of one round, as its planner leaves it."""

    __slots__ = ("order", "overhead", "cums", "blocks", "inside", "root")

    def __init__(
        self,
        order: list[Entry],
        overhead: int,
        cums: list[int] | None = None,
        blocks: dict[Node, Block] | None = None,
        inside: dict[Node, list[Block]] | None = None,
        root: Node | None = None,
    ) -> None:
        self.order = order  # the service order
        self.overhead = overhead  # tokens of work per request besides its prompt
        # Cumulative work (tokens) at each completion, or None: the Clearing works it out on
        # demand, by marking the nodes each request needs (bid-blind orders).
        self.cums = cums
        # DFS orders: the block of each node that holds several blocks. A block of one request
        # is found in its node's (or its leaf's parent's) ``inside`` by its key, so that a round
        # files nothing per request.
        self.blocks = blocks
        # DFS orders: the blocks at each node that holds several (and at the root), in order.
        self.inside = inside
        self.root = root  # DFS orders: the tree's root, where the blocks start
