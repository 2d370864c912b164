"""The ordering policies of DESIGN.md 4.2, and the KV auctions (dfs-auction-kv and
dfs-auction-kv-split), as a registry from name to ``Policy``.

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

dfs-auction-kv is dfs-auction-density with one change, for KV pressure: a block whose edge is
already (partly) cached counts its size a ``KV_CACHED_BOOST``-th, so a subtree whose prefix is in
the cache is not pushed back (and evicted, and computed again) by a block that is only a little
denser. Whether an edge is cached does not depend on any bid, so the order stays monotone in each
request's bid and the charges are the same crossing points (payments.py, ``key_size``).

dfs-auction-kv-split is dfs-auction-kv on the tree contracted at fully cached subtrees: a subtree
whose edge is wholly in the KV cache (``Node.fully_cached``) costs no prefill to keep together,
so it is no block of its own; its blocks go among its parent's, where they count as cached (they
sit right under a cached prefix). Its urgent requests can then go ahead of other subtrees while
its background ones wait, as under highest-bid, at no extra work. Which subtrees are split
depends on the cache alone, not on bids, and each block's work is still exactly what serving it
computes, so the order stays monotone and the charges are the same crossing points over the
contracted tree. Its planner (``_split_step``) keeps, at a split node, what changed in its
blocks since the last round, so that the parent patches its own blocks by that alone.

The loops are written out by hand, leaves (one request, no children) taking a short path: a round
visits every node, and most nodes are leaves.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter

from .payments import ChargeRule, DfsCharges, FlatCharges
from .plan import Block, Plan, block_cached
from .tree import INF, PLAN_TOKENS, Entry, Node, RequestTree

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
    # A block that counts as cached (plan.block_cached: its edge, the tokens into it from its
    # parent, is already partly in the KV cache) counts its size divided by this: 1 for the
    # plain keys. A request that ends at a node with other blocks has no edge of its own.
    cached_boost: float = 1.0
    # Fully cached subtrees are no blocks of their own: their blocks go among their parents'
    # (dfs-auction-kv-split; Node.fully_cached).
    split_cached: bool = False

    def __call__(self, bsum: float, n: int, work: int, cached: bool = False) -> float:
        """The key of a block with ``n`` requests, bid sum ``bsum`` (any unit) and ``work``;
        ``cached``: its edge is (partly) cached.

        A block that needs no work costs the others nothing, so by bid density it goes first
        whatever its bid.
        """
        size = work if self.per_work else n
        if cached:
            size = size / self.cached_boost
        return bsum / size if size > 0 else INF


AVERAGE_BID = BlockKey("average bid", per_work=False)
BID_DENSITY = BlockKey("bid density", per_work=True)
# dfs-auction-kv: bid density where a block whose edge is already in the KV cache counts a
# quarter of its work. Under KV pressure a cached subtree that waits is evicted and computed
# again, at the cost of everyone behind it; this keeps it ahead unless an uncached block's
# density is 4x its own. The factor was chosen on the benchmark's KV-pressure sweep (README).
KV_CACHED_BOOST = 4.0
CACHE_KEPT = BlockKey("bid density, cached edges kept", True, KV_CACHED_BOOST)
# dfs-auction-kv-split: the same, fully cached subtrees split into their blocks.
CACHE_SPLIT = BlockKey("bid density, cached edges kept, cached subtrees split", True,
                       KV_CACHED_BOOST, split_cached=True)  # fmt: skip


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
_tie_of = itemgetter(1)
_inner_of = itemgetter(5)
_handle_of = attrgetter("handle")
_bsum_of = itemgetter(3)
_work_of = itemgetter(4)


class _Memo:
    """A DFS auction's state at one node holding several requests, kept across rounds.

    ``built``: the tree's version when it was worked out; it is still right while the node has
    not changed since (``Node.changed``). ``kids``: the block of each child as of then (a
    child unchanged since reuses it); ``own``: the blocks of the requests ending here.
    ``inside``: all of them in service order; ``bsum``, ``work``: their sums; ``tie``: the
    earliest of their ties; ``nested``: how many are nodes' blocks. ``block``: the node's own
    block, its edge included. ``flat``: the requests of the subtree in service order, and
    ``handles`` the engine's handles on them (``Entry.handle``), in the same order.

    dfs-auction-kv-split: a child that is split (``Node.fully_cached``) has its state, not a
    block, in ``kids``: its blocks are among this node's. ``split``: this node was split when
    worked out; then ``gone`` and ``came`` are the blocks that left and joined its blocks then
    (all of them, old and new, after a rebuild), what its parent patches its own by.
    """

    __slots__ = (
        "built", "kids", "own", "inside", "bsum", "work", "tie", "nested", "block", "flat",
        "handles", "retie", "split", "gone", "came",
    )  # fmt: skip

    def __init__(self) -> None:
        self.built = -1
        self.kids: dict[Node, Block] = {}
        self.own: list[Block] = []
        self.inside: list[Block] = []
        self.bsum = 0
        self.work = 0
        self.tie: tuple | None = None  # the earliest (arrival, id) among the blocks
        self.nested = 0  # blocks that are nodes' (the others are requests')
        self.block: Block | None = None
        self.flat: list[Entry] = []
        self.handles: list[object] = []
        self.retie = False  # the earliest block went: the tie is looked for again (``settle``)
        self.split = False
        self.gone: Sequence[Block] = ()
        self.came: Sequence[Block] = ()

    def drop(self, block: Block) -> None:
        """Take a block out of the sorted blocks and the sums."""
        blocks = self.inside
        i = bisect_left(blocks, block)
        if i == len(blocks) or blocks[i][5] is not block[5]:
            raise RuntimeError("a block went missing from its node's order")
        del blocks[i]
        self.bsum -= block[3]
        self.work -= block[4]
        if type(block[5]) is Node:
            self.nested -= 1
        if block[1] == self.tie:
            self.retie = True

    def add(self, block: Block) -> None:
        """Put a block into the sorted blocks and the sums."""
        insort(self.inside, block)
        self.bsum += block[3]
        self.work += block[4]
        if type(block[5]) is Node:
            self.nested += 1
        if self.tie is None or block[1] < self.tie:
            self.tie = block[1]

    def settle(self) -> None:
        """After drops and adds: the tie looked for again if its block went."""
        blocks = self.inside
        if not blocks:
            self.tie = None
        elif self.retie:
            self.tie = min(map(_tie_of, blocks))
        self.retie = False

    def sort_blocks(self, blocks: list[Block]) -> None:
        """Take ``blocks`` as the node's blocks, sorted, with their sums."""
        blocks.sort()  # plain tuple order: (nk, tie), ties being unique among siblings
        self.inside = blocks
        self.bsum = sum(map(_bsum_of, blocks))
        self.work = sum(map(_work_of, blocks))
        self.tie = min(map(_tie_of, blocks)) if blocks else None
        self.nested = sum(1 for b in blocks if type(b[5]) is Node)
        self.retie = False


class _MemoView:
    """A round's view of the nodes' DFS state under one planner token: ``view[node]`` is that
    node's ``inside`` list or block (``attr``), as payments.py reads a Plan's dicts."""

    __slots__ = ("token", "attr")

    def __init__(self, token: int, attr: str) -> None:
        self.token = token
        self.attr = attr

    def __getitem__(self, node: Node):
        state = _state(node, self.token)
        if state is None:
            raise RuntimeError(
                "the round's planner state is gone (more rounds with other settings cleared "
                "on this tree since than it keeps); clear the round again"
            )
        return getattr(state, self.attr)


def _state(x: Node, token: int) -> _Memo | None:
    memo = x.memo
    return None if memo is None else memo.get(token)


def _new_state(x: Node, token: int, live: Callable[[], set[int]]) -> _Memo:
    memo = x.memo
    if memo is None:
        memo = x.memo = {}
    elif len(memo) >= PLAN_TOKENS:  # drop the states of planners the tree no longer keeps
        keep = live()
        for t in [t for t in memo if t not in keep]:
            del memo[t]
    state = memo[token] = _Memo()
    return state


def _dfs_states(
    tree: RequestTree,
    density: bool,
    reserve: int,
    overhead: int,
    boost: float = 1.0,
    split: bool = False,
) -> tuple[int, _Memo]:
    """Bring the DFS auction's state up to date at every node that changed since it was last
    worked out; returns the planner's token and the root's state.

    Nodes holding one request (leaves, most nodes) keep no state: their block is the request's,
    worked out by the parent. A node is worked out again only if it changed, from its
    children's blocks (an unchanged child's kept, a changed one's worked out first): a round
    costs time proportional to the changed nodes and their children, plus copying the order.
    """
    token = tree.plan_token((density, boost, split, reserve, overhead))
    root = tree.root
    rs = _state(root, token)
    if rs is not None and root.changed <= rs.built:
        return token, rs
    # The changed nodes holding several requests, parents before children, each with its
    # children that changed since it was last worked out.
    todo = [root]
    changes: list[list[Node]] = []
    i = 0
    while i < len(todo):
        x = todo[i]
        i += 1
        xs = _state(x, token)
        built = -1 if xs is None else xs.built
        changed = [c for c in x.children.values() if c.changed > built]
        changes.append(changed)
        for c in changed:
            if c.size > 1:
                todo.append(c)
    version = tree.version
    live = tree.live_tokens
    for x, changed in zip(reversed(todo), reversed(changes), strict=True):
        xs = _state(x, token) or _new_state(x, token, live)
        if split:
            _split_step(x, xs, changed, token, density, reserve, overhead, boost)
        elif xs.built < 0 or 4 * len(changed) > len(xs.kids):
            _rebuild(x, xs, token, density, reserve, overhead, boost)
        else:
            _patch(x, xs, changed, token, density, reserve, overhead, boost)
        xs.block = _node_block(x, xs, density, boost, split)
        xs.built = version
        if xs.split:  # its blocks are its parent's: nothing is served from its own order
            continue
        blocks = xs.inside
        if xs.nested:
            flat: list[Entry] = []
            handles: list[object] = []
            for block in blocks:
                inner = block[5]
                if type(inner) is Node:
                    inner_state = inner.memo[token]
                    flat.extend(inner_state.flat)
                    handles.extend(inner_state.handles)
                else:
                    flat.append(inner)
                    handles.append(inner.handle)
        else:  # requests only (a node whose children are all leaves): no loop in Python
            flat = list(map(_inner_of, blocks))
            handles = list(map(_handle_of, flat))
        xs.flat = flat
        xs.handles = handles
    return token, todo[0].memo[token]


def _node_block(x: Node, xs: _Memo, density: bool, boost: float, split: bool) -> Block:
    """The block of a node holding several requests, from its state's sums, its edge included."""
    bsum = xs.bsum
    work = xs.work + x.ew
    size = work if density else x.size
    if boost != 1.0 and block_cached(x, split):
        size /= boost
    if size:
        nk = -(bsum / size)
    else:  # no work: first whatever its bids; no requests: only the root of an empty tree
        nk = -INF if density else 0.0
    return (nk, xs.tie, x.size, bsum, work, x)


def _child_block(
    c: Node,
    token: int,
    density: bool,
    reserve: int,
    overhead: int,
    boost: float,
    under: bool = False,
) -> Block:
    """The block of a child: its state's, or for a leaf holding one request (the common case)
    the request's, the leaf's edge included (payments.request_block finds it by the same key).
    ``under``: the parent is a split subtree (dfs-auction-kv-split), so the leaf's block counts
    as cached whatever its edge (plan.block_cached)."""
    if c.size > 1:
        return c.memo[token].block
    for e in c.reqs.values():
        b = e.ticks
        if b < reserve:
            b = 0
        ew = c.ew
        cw = ew + overhead
        if boost != 1.0 and (under or c.edge_cached()):
            size = (cw if density else 1) / boost
            nk = -(b / size) if size else -INF
        elif density:
            nk = -(b / cw) if cw else -INF
        else:
            nk = -b
        return (nk, e.tie, 1, b, cw, e)
    raise RuntimeError("a leaf without a request")  # the tree never keeps one


def _own_blocks(
    x: Node, density: bool, reserve: int, overhead: int, boost: float = 1.0
) -> list[Block]:
    """The blocks of the requests that end at ``x``, one each; ``boost``: they count as cached
    (``x`` is a split subtree, dfs-auction-kv-split), else 1."""
    out = []
    for e in x.reqs.values():
        b = e.ticks
        if b < reserve:
            b = 0
        if boost != 1.0:
            size = (overhead if density else 1) / boost
            nk = -(b / size) if size else -INF
        elif density:
            nk = -(b / overhead) if overhead else -INF
        else:
            nk = -b
        out.append((nk, e.tie, 1, b, overhead, e))
    return out


def _rebuild(
    x: Node, xs: _Memo, token: int, density: bool, reserve: int, overhead: int, boost: float
) -> None:
    """Work a node's blocks out from its children's (an unchanged child's kept) and sort them."""
    built = xs.built
    old = xs.kids
    kids: dict[Node, Block] = {}
    for c in x.children.values():
        kids[c] = (
            old[c]
            if c.changed <= built
            else _child_block(c, token, density, reserve, overhead, boost)
        )
    own = _own_blocks(x, density, reserve, overhead)
    xs.kids = kids
    xs.own = own
    xs.sort_blocks([*kids.values(), *own])


def _patch(
    x: Node,
    xs: _Memo,
    changed: list[Node],
    token: int,
    density: bool,
    reserve: int,
    overhead: int,
    boost: float,
) -> None:
    """Replace the blocks that changed in a node's sorted blocks: those of the children that
    changed, of children gone (cut off or merged away) and of the requests ending here."""
    kids = xs.kids
    for block in xs.own:
        xs.drop(block)
    for c in changed:
        old = kids.get(c)
        if old is not None:
            xs.drop(old)
        kids[c] = block = _child_block(c, token, density, reserve, overhead, boost)
        xs.add(block)
    if len(kids) > len(x.children):  # children gone since (cut off, merged away): drop them
        for c in kids.keys() - set(x.children.values()):
            xs.drop(kids.pop(c))
    own = _own_blocks(x, density, reserve, overhead)
    for block in own:
        xs.add(block)
    xs.own = own
    xs.settle()


def _split_step(
    x: Node,
    xs: _Memo,
    changed: list[Node],
    token: int,
    density: bool,
    reserve: int,
    overhead: int,
    boost: float,
) -> None:
    """dfs-auction-kv-split's work at a changed node: its blocks patched by what changed (a
    split child's by what its own blocks gained and lost), or worked out again when that is
    most of them, or when this node's split, or a child's, changed (the boosts of the blocks
    below depend on it). A split node keeps what changed (``gone``, ``came``) for its parent."""
    now = x.fully_cached()
    old = xs.inside
    if (
        xs.built < 0
        or xs.split != now
        or not _split_patch(x, xs, changed, token, density, reserve, overhead, boost)
    ):
        _split_rebuild(x, xs, token, density, reserve, overhead, boost, now)
        if now:
            xs.gone, xs.came = old, xs.inside
    if not now:
        xs.gone = xs.came = ()
    xs.split = now


def _split_rebuild(
    x: Node,
    xs: _Memo,
    token: int,
    density: bool,
    reserve: int,
    overhead: int,
    boost: float,
    now: bool,
) -> None:
    """dfs-auction-kv-split: a node's blocks worked out afresh, a split child's blocks taken in
    as its own, every block keyed for this node's split ``now``."""
    kids: dict[Node, Block | _Memo] = {}
    blocks: list[Block] = []
    for c in x.children.values():
        if c.size == 1:
            kids[c] = block = _child_block(c, token, density, reserve, overhead, boost, now)
            blocks.append(block)
            continue
        cs = c.memo[token]
        if c.fully_cached():
            kids[c] = cs
            blocks.extend(cs.inside)
        else:  # its key depends on whether this node is split: keyed again
            kids[c] = cs.block = block = _node_block(c, cs, density, boost, True)
            blocks.append(block)
    own = _own_blocks(x, density, reserve, overhead, boost if now else 1.0)
    blocks.extend(own)
    xs.kids = kids
    xs.own = own
    xs.sort_blocks(blocks)


def _split_patch(
    x: Node,
    xs: _Memo,
    changed: list[Node],
    token: int,
    density: bool,
    reserve: int,
    overhead: int,
    boost: float,
) -> bool:
    """dfs-auction-kv-split: patch a node whose split did not change by what changed below it;
    False, having changed nothing, where it must be worked out afresh instead."""
    kids = xs.kids
    under = xs.split
    gone: list[Block] = []
    came: list[Block] = []
    records: dict[Node, Block | _Memo] = {}  # the changed children's, once patched
    new_kids = 0
    for c in changed:
        old = kids.get(c)
        if old is None:
            new_kids += 1
        was_split = type(old) is _Memo
        if c.fully_cached():
            cs = c.memo[token]
            if was_split:
                gone.extend(cs.gone)
                came.extend(cs.came)
            else:
                if old is not None:
                    gone.append(old)
                came.extend(cs.inside)
            records[c] = cs
            continue
        if was_split:  # what it held here is known only as its blocks were
            return False
        if old is not None:
            gone.append(old)
        records[c] = block = _child_block(c, token, density, reserve, overhead, boost, under)
        came.append(block)
    left: list[Node] = []
    if len(kids) + new_kids > len(x.children):  # children gone since (cut off, merged away)
        left = list(kids.keys() - set(x.children.values()))
        for c in left:
            old = kids[c]
            if type(old) is _Memo:
                return False
            gone.append(old)
    if 4 * (len(gone) + len(came)) > len(xs.inside) + 4:
        return False
    own = _own_blocks(x, density, reserve, overhead, boost if under else 1.0)
    gone.extend(xs.own)
    came.extend(own)
    for block in gone:
        xs.drop(block)
    for block in came:
        xs.add(block)
    xs.settle()
    for c in left:
        del kids[c]
    kids.update(records)
    xs.own = own
    if under:
        xs.gone, xs.came = gone, came
    return True


def _plan_dfs_auction(tree: RequestTree, policy: Policy, reserve: int, overhead: int) -> Plan:
    """DFS order with sibling blocks by the policy's ``BlockKey`` (average bid or bid density).

    The key is written out inline, as ``-key`` in a block's ``nk``, so that ascending sorts go
    first. The state of each node is kept across rounds and worked out again only where the
    tree changed (``_dfs_states``); the plan reads it through views, and leaves the cumulative
    work to the Clearing to count for the requests it is asked about.
    """
    key = policy.block_key
    token, root_state = _dfs_states(
        tree, key.per_work, reserve, overhead, key.cached_boost, key.split_cached
    )
    return Plan(
        root_state.flat,
        overhead,
        None,
        _MemoView(token, "block"),
        _MemoView(token, "inside"),
        tree.root,
        root_state.handles,
        key.cached_boost,
        key.split_cached,
    )


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
    Policy("dfs-auction-kv",      True,      True,  CACHE_KEPT,  _plan_dfs_auction,  DfsCharges),
    Policy("dfs-auction-kv-split", True,     True,  CACHE_SPLIT, _plan_dfs_auction,  DfsCharges),
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


def block_key(policy: str, bsum: float, n: int, work: int, cached: bool = False) -> float:
    """The key the DFS auction ``policy`` orders sibling blocks by, higher first (``BlockKey``);
    ``cached``: the block's edge is (partly) cached."""
    key = POLICY[policy_checked(policy)].block_key
    if key is None:
        raise ValueError(f"policy {policy!r} does not order blocks by a key")
    return key(bsum, n, work, cached)
