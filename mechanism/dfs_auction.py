"""The DFS auctions' planner: DFS order of the request tree, sibling blocks by the policy's key.

Every subtree is served as one contiguous block: at each node the blocks (child subtrees and the
requests that end there; plan.Block) go in order of the policy's ``BlockKey``, ties to the
earliest arrival, then the smallest id. The planner returns the round's ``Plan``: the service
order, and the nodes' blocks that the charges (payments.py) read.

What each node's blocks are is kept in the node across rounds (``_Memo``, one per planner
setting: ``RequestTree.plan_token``) and worked out again only where the tree changed: a round
costs time proportional to the changed nodes and their children, plus copying the order. What
is kept depends only on the subtree and the setting, so that clearings of one tree do not
disturb each other (plan.py).

dfs-auction-kv-split plans the tree contracted at fully cached subtrees (policies.py): a split
node's blocks are its parent's. Its steps (``_split_step``) keep, at a split node, what changed
in its blocks since the last round, so that the parent patches its own blocks by that alone.

The loops are written out by hand, leaves (one request, no children) taking a short path: a round
visits every node, and most nodes are leaves.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter, itemgetter
from typing import Generic, Protocol, TypeVar, final

from .plan import BSUM, INNER, TIE, WORK, Block, BlockKey, Plan
from .requests import effective_bid
from .tree import INF, PLAN_TOKENS, Entry, Node, RequestTree

_tie_of = itemgetter(TIE)
_inner_of = itemgetter(INNER)
_bsum_of = itemgetter(BSUM)
_work_of = itemgetter(WORK)
_handle_of = attrgetter("handle")
_NO_TIE = (float("inf"), "")  # the tie of a node with no blocks (the root of an empty tree)
_T = TypeVar("_T")


class KeyedPolicy(Protocol):
    """What the planner reads of its policy (policies.Policy, which imports this module)."""

    @property
    def name(self) -> str: ...

    @property
    def block_key(self) -> BlockKey | None: ...


def plan_dfs_auction(tree: RequestTree, policy: KeyedPolicy, reserve: int, overhead: int) -> Plan:
    """DFS order with sibling blocks by the policy's ``BlockKey`` (average bid or bid density).

    The plan reads the nodes' kept state (``_dfs_states``) through views, and leaves the
    cumulative work to the Clearing to count for the requests it is asked about.
    """
    key = policy.block_key
    if key is None:
        raise ValueError(f"policy {policy.name!r} does not order blocks by a key")
    token, root_state = _dfs_states(tree, key, reserve, overhead)
    return Plan(
        root_state.flat,
        overhead,
        blocks=_View(token, attrgetter("block")),
        inside=_View(token, attrgetter("inside")),
        root=tree.root,
        handles=root_state.handles,
        key=key,
    )


# Final: told from a block by ``type(x) is _Memo`` (tree.py says why).
@final
class _Memo:
    """A DFS auction's state at one node holding several requests, kept across rounds.

    ``built``: the tree's version when it was worked out; it is still right while the node has
    not changed since (``Node.changed``). ``kids``: the block of each child as of then (a
    child unchanged since reuses it); ``own``: the blocks of the requests ending here.
    ``inside``: all of them in service order; ``bsum``, ``work``: their sums; ``tie``: the
    earliest of their ties. ``block``: the node's own block, its edge included. ``flat``: the
    requests of the subtree in service order, and ``handles`` the engine's handles on them
    (``Entry.handle``), in the same order.

    dfs-auction-kv-split keeps ``parts`` instead of ``kids``: of each child its block, or, for a
    child that is split (``Node.fully_cached``), its state: its blocks are among this node's.
    ``split``: this node was split when worked out; then ``gone`` and ``came`` are the blocks
    that left and joined its blocks then (all of them, old and new, after a rebuild), what its
    parent patches its own by.
    """

    __slots__ = (
        "built", "kids", "parts", "own", "inside", "bsum", "work", "tie", "block", "flat",
        "handles", "retie", "split", "gone", "came",
    )  # fmt: skip

    # Set by the round that works the node out, before anything reads it.
    block: Block

    def __init__(self) -> None:
        self.built = -1
        self.kids: dict[Node, Block] = {}
        self.parts: dict[Node, Block | _Memo] = {}
        self.own: list[Block] = []
        self.inside: list[Block] = []
        self.bsum = 0
        self.work = 0
        self.tie: tuple[float, str] | None = None  # the earliest (arrival, id) among the blocks
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
        if i == len(blocks) or blocks[i][INNER] is not block[INNER]:
            raise RuntimeError("a block went missing from its node's order")
        del blocks[i]
        self.bsum -= block[BSUM]
        self.work -= block[WORK]
        if block[TIE] == self.tie:
            self.retie = True

    def add(self, block: Block) -> None:
        """Put a block into the sorted blocks and the sums."""
        insort(self.inside, block)
        self.bsum += block[BSUM]
        self.work += block[WORK]
        if self.tie is None or block[TIE] < self.tie:
            self.tie = block[TIE]

    def swap(self, gone: Iterable[Block], came: Iterable[Block]) -> None:
        """Take the blocks ``gone`` out and put the blocks ``came`` in, then ``settle``."""
        for block in gone:
            self.drop(block)
        for block in came:
            self.add(block)
        self.settle()

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
        blocks.sort()  # by (nk, tie), ties being unique among siblings
        self.inside = blocks
        self.bsum = sum(map(_bsum_of, blocks))
        self.work = sum(map(_work_of, blocks))
        self.tie = min(map(_tie_of, blocks)) if blocks else None
        self.retie = False


class _View(Generic[_T]):
    """A round's view of the nodes' DFS state under one planner token, as payments.py reads a
    Plan's (plan.NodeLookup): ``view[node]`` is ``read`` of that node's state (``_Memo.inside``,
    its blocks in order, or ``_Memo.block``, its own block)."""

    __slots__ = ("token", "read")

    def __init__(self, token: int, read: Callable[[_Memo], _T]) -> None:
        self.token = token
        self.read = read

    def __getitem__(self, node: Node) -> _T:
        state = _state(node, self.token)
        if state is None:
            raise RuntimeError(
                "the round's planner state is gone (more rounds with other settings cleared "
                "on this tree since than it keeps); clear the round again"
            )
        return self.read(state)


def _state(x: Node, token: int) -> _Memo | None:
    memo = x.memo
    if memo is None:
        return None
    state: _Memo | None = memo.get(token)
    return state


def _kept(x: Node, token: int) -> _Memo:
    """The state at ``x``, a node holding several requests that this round has brought up to
    date (its children's before its own: ``_dfs_states``)."""
    memo = x.memo
    assert memo is not None
    state: _Memo = memo[token]
    return state


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


def _dfs_states(tree: RequestTree, key: BlockKey, reserve: int, overhead: int) -> tuple[int, _Memo]:
    """Bring the DFS auction's state up to date at every node that changed since it was last
    worked out, children first; returns the planner's token and the root's state.

    Nodes holding one request (leaves, most nodes) keep no state: their block is the request's,
    worked out by the parent. A node is worked out again only if it changed, from its
    children's blocks (an unchanged child's kept): a round costs time proportional to the
    changed nodes and their children, plus copying the order.
    """
    token = tree.plan_token((key, reserve, overhead))
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
        noted = x.noted
        if noted is not None and built >= x.noted_since:  # the children it noted: fewer
            kids = x.children
            changed = [
                c
                for c in dict.fromkeys(noted)
                if c.changed > built and kids.get(c.seq[c.start]) is c  # still its child
            ]
        else:
            changed = [c for c in x.children.values() if c.changed > built]
        changes.append(changed)
        for c in changed:
            if c.size > 1:
                todo.append(c)
    version = tree.version
    live = tree.live_tokens
    split = key.split_cached
    for x, changed in zip(reversed(todo), reversed(changes), strict=True):
        xs = _state(x, token) or _new_state(x, token, live)
        # Its order held requests only (as many as blocks; each block holds 1 or more), and is
        # not the root's (refilled whole, below, into the lists the round's Plan reads): it
        # may be patched with its blocks.
        patchable = len(xs.flat) == len(xs.inside) and x.parent is not None
        patched = False
        if split:
            _split_step(x, xs, changed, token, key, reserve, overhead)
        else:
            patched = _step(x, xs, changed, token, key, reserve, overhead, patchable)
        xs.block = _node_block(x, xs, key)
        xs.built = x.noted_since = version
        x.noted = []
        if xs.split or patched:  # its blocks are its parent's; or its orders were patched
            continue
        flat, handles = _orders(xs.inside, x.size, token)
        if x is root:
            # The root's orders go into the same two lists every round: each holds every waiting
            # request, and a new list is walked by the garbage collector's young collections
            # until it is old (about 0.3 ms of a round at 10,000 waiting, each). No valid round
            # sees them change: a Clearing reads its order only while the tree is as it was
            # cleared.
            xs.flat[:] = flat
            xs.handles[:] = handles
        else:
            xs.flat = flat
            xs.handles = handles
    return token, _kept(root, token)


def _orders(blocks: list[Block], size: int, token: int) -> tuple[list[Entry], list[object]]:
    """The requests of a node's sorted ``blocks`` (``size`` of them) in order, and their
    handles: each node block's kept orders, in turn."""
    if len(blocks) == size:  # requests only (a node whose children are all leaves): no loop
        flat = list(map(_inner_of, blocks))
        return flat, list(map(_handle_of, flat))
    flat = []
    handles: list[object] = []
    for block in blocks:
        inner = block[INNER]
        if type(inner) is Node:
            memo = inner.memo  # ``_kept``, written out: once per block of a node
            assert memo is not None
            inner_state: _Memo = memo[token]
            flat.extend(inner_state.flat)
            handles.extend(inner_state.handles)
        else:
            flat.append(inner)
            handles.append(inner.handle)
    return flat, handles


def _node_block(x: Node, xs: _Memo, key: BlockKey) -> Block:
    """The block of a node holding several requests, from its state's sums, its edge included
    (and of the root of an empty tree, which has no blocks and is no one's sibling: no tie)."""
    bsum = xs.bsum
    work = xs.work + x.ew
    nk = key.nk(bsum, x.size, work, key.counts_cached(x))
    return (nk, xs.tie or _NO_TIE, x.size, bsum, work, x)


def _child_blocks(
    children: Iterable[Node],
    token: int,
    key: BlockKey,
    reserve: int,
    overhead: int,
    under: bool = False,
) -> list[Block]:
    """The blocks of ``children``: a node's its state's, a leaf's its one request's, the leaf's
    edge included (payments.request_block finds it by the same key). ``under``: they sit right
    under a split node (dfs-auction-kv-split), so count as cached whatever their edges
    (plan.block_cached)."""
    # ``effective_bid`` and ``key.nk`` written out (the same arithmetic): a round with the wait
    # bound on comes here for every request that crossed a credit step.
    per_work = key.per_work
    boost = key.cached_boost
    boosted = boost != 1.0
    blocks: list[Block] = []
    append = blocks.append
    for c in children:
        if c.size > 1:
            append(_kept(c, token).block)
            continue
        (e,) = c.reqs.values()  # a leaf holds one request: the tree keeps no leaf without one
        t = e.ticks
        b = (t if t >= reserve else 0) + e.credit  # the age credit counts as bid here
        work = c.ew + overhead
        size: float = work if per_work else 1
        if boosted and (under or c.edge_cached()):
            size = size / boost
        append((-(b / size) if size > 0 else -INF, e.tie, 1, b, work, e))
    return blocks


def _own_blocks(x: Node, key: BlockKey, reserve: int, overhead: int, under: bool) -> list[Block]:
    """The blocks of the requests that end at ``x``, one each; ``under``: they count as cached
    (``x`` is a split subtree, dfs-auction-kv-split)."""
    nk = key.nk
    out: list[Block] = []
    for e in x.reqs.values():
        b = effective_bid(e.ticks, reserve, 0) + e.credit
        out.append((nk(b, 1, overhead, under), e.tie, 1, b, overhead, e))
    return out


def _step(
    x: Node,
    xs: _Memo,
    changed: list[Node],
    token: int,
    key: BlockKey,
    reserve: int,
    overhead: int,
    track: bool,
) -> bool:
    """A node's blocks brought up to date: patched (``_patch``), or, when most of them changed,
    taken afresh from its children's (an unchanged child's kept) and sorted. Returns whether
    its orders were patched with them (``_patch``, ``track``)."""
    fresh = _child_blocks(changed, token, key, reserve, overhead)
    own = _own_blocks(x, key, reserve, overhead, False) if x.reqs else []
    built = xs.built
    patched = False
    if built < 0 or 4 * len(changed) > len(xs.kids):
        old = xs.kids
        kids = {c: old[c] for c in x.children.values() if c.changed <= built} if built >= 0 else {}
        kids.update(zip(changed, fresh, strict=True))
        xs.kids = kids
        xs.sort_blocks([*kids.values(), *own])
    else:
        patched = _patch(x, xs, changed, fresh, own, track)
    xs.own = own
    return patched


def _patch(
    x: Node, xs: _Memo, changed: list[Node], fresh: list[Block], own: list[Block], track: bool
) -> bool:
    """Replace the blocks that changed in a node's sorted blocks: those of the ``changed``
    children (now ``fresh``), of children gone (cut off or merged away) and of the requests
    ending here (now ``own``).

    With ``track`` (its blocks are requests only, one each, as its orders have them), the
    orders are patched by the same moves while every block is a request's and only changed
    children's blocks move; returns whether they were (else they are to be built again)."""
    kids = xs.kids
    patch = track and not (xs.own or own)
    for block in xs.own:
        xs.drop(block)
    # The children gone go first. A new child's block can equal a gone one's in every field but
    # its node or request, which do not compare: a request that left and came back between two
    # rounds (SGLang re-queues a retracted request under its id) has a new leaf and entry.
    if len(kids) + sum(c not in kids for c in changed) > len(x.children):
        children = set(x.children.values())
        for c in [c for c in kids if c not in children]:
            xs.drop(kids.pop(c))
            patch = False
    # ``drop`` and ``add`` written out for the changed children: with the wait bound on, a
    # round patches every request that crossed a credit step here.
    blocks = xs.inside
    bsum = xs.bsum
    work = xs.work
    tie = xs.tie
    retie = xs.retie
    order = xs.flat
    held = xs.handles
    for c, block in zip(changed, fresh, strict=True):
        old = kids.get(c)
        i = -1
        if old is not None:
            i = bisect_left(blocks, old)
            if i == len(blocks) or blocks[i][INNER] is not old[INNER]:
                raise RuntimeError("a block went missing from its node's order")
            del blocks[i]
            bsum -= old[BSUM]
            work -= old[WORK]
            if old[TIE] == tie:
                retie = True
        kids[c] = block
        j = bisect_right(blocks, block)  # ``insort``, the place kept
        blocks.insert(j, block)
        if patch:
            inner = block[INNER]
            if type(inner) is Entry:  # the orders' places are the blocks': requests only
                if i >= 0:
                    del order[i]
                    del held[i]
                order.insert(j, inner)
                held.insert(j, inner.handle)
            else:  # a leaf grew a child: its block is a node's now
                patch = False
        bsum += block[BSUM]
        work += block[WORK]
        if tie is None or block[TIE] < tie:
            tie = block[TIE]
    xs.bsum = bsum
    xs.work = work
    xs.tie = tie
    xs.retie = retie
    for block in own:
        xs.add(block)
    xs.settle()
    return patch


def _split_step(
    x: Node,
    xs: _Memo,
    changed: list[Node],
    token: int,
    key: BlockKey,
    reserve: int,
    overhead: int,
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
        or not _split_patch(x, xs, changed, token, key, reserve, overhead)
    ):
        _split_rebuild(x, xs, token, key, reserve, overhead, now)
        if now:
            xs.gone, xs.came = old, xs.inside
    if not now:
        xs.gone = xs.came = ()
    xs.split = now


def _split_rebuild(
    x: Node, xs: _Memo, token: int, key: BlockKey, reserve: int, overhead: int, now: bool
) -> None:
    """dfs-auction-kv-split: a node's blocks worked out afresh, a split child's blocks taken in
    as its own, every block keyed for this node's split ``now``."""
    parts: dict[Node, Block | _Memo] = {}
    blocks: list[Block] = []
    leaves: list[Node] = []
    for c in x.children.values():
        if c.size == 1:
            leaves.append(c)
            continue
        cs = _kept(c, token)
        if c.fully_cached():
            parts[c] = cs
            blocks.extend(cs.inside)
        else:  # its key depends on whether this node is split: keyed again
            parts[c] = cs.block = block = _node_block(c, cs, key)
            blocks.append(block)
    leaf_blocks = _child_blocks(leaves, token, key, reserve, overhead, now)
    parts.update(zip(leaves, leaf_blocks, strict=True))
    blocks.extend(leaf_blocks)
    own = _own_blocks(x, key, reserve, overhead, now)
    blocks.extend(own)
    xs.parts = parts
    xs.own = own
    xs.sort_blocks(blocks)


def _split_patch(
    x: Node,
    xs: _Memo,
    changed: list[Node],
    token: int,
    key: BlockKey,
    reserve: int,
    overhead: int,
) -> bool:
    """dfs-auction-kv-split: patch a node whose split did not change by what its changed
    children bring and take away (a split child: what its own blocks gained and lost), and by
    its children gone (cut off or merged away); False, having changed nothing, where it must be
    worked out afresh instead: what changed is not known from what the node kept (a child that
    was split and is no longer, or that was split and went), or is most of its blocks."""
    parts = xs.parts
    gone: list[Block] = []
    came: list[Block] = []
    records: dict[Node, Block | _Memo] = {}  # the changed children's new parts
    keyed: list[Node] = []  # the changed children that are blocks here
    new_kids = 0
    for c in changed:
        old = parts.get(c)
        if old is None:
            new_kids += 1
        if c.fully_cached():
            cs = _kept(c, token)
            if type(old) is _Memo:
                gone.extend(cs.gone)
                came.extend(cs.came)
            else:
                if old is not None:
                    gone.append(old)
                came.extend(cs.inside)
            records[c] = cs
            continue
        if type(old) is _Memo:  # what it held here is known only as its blocks were
            return False
        if old is not None:
            gone.append(old)
        keyed.append(c)
    under = xs.split
    fresh = _child_blocks(keyed, token, key, reserve, overhead, under)
    records.update(zip(keyed, fresh, strict=True))
    came.extend(fresh)
    left: list[Node] = []
    if len(parts) + new_kids > len(x.children):  # children gone since (cut off, merged away)
        left = list(parts.keys() - set(x.children.values()))
        for c in left:
            old = parts[c]
            if type(old) is _Memo:
                return False
            gone.append(old)
    if 4 * (len(gone) + len(came)) > len(xs.inside) + 4:
        return False
    own = _own_blocks(x, key, reserve, overhead, under)
    gone.extend(xs.own)
    came.extend(own)
    xs.swap(gone, came)
    for c in left:
        del parts[c]
    parts.update(records)
    xs.own = own
    if under:
        xs.gone, xs.came = gone, came
    return True
