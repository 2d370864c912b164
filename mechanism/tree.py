"""The request tree: a compressed trie over the token ids of the waiting requests.

Every waiting request ends at a node. A node's edge covers the token positions ``start..end`` of
every request below it; edges keep a reference to one such request's token tuple instead of a copy,
so inserting or removing a request costs time proportional to its length (token comparisons run as
slice comparisons in C). Requests that share a prefix share the nodes of that prefix whether or not
it is cached yet. How much of an edge is cached follows from the requests' ``cached_len`` (a
token cached for one request is cached for every request with the same prefix): each node keeps
the deepest cached position below it, updated on the way up by every insert, removal and update.

A scheduling round walks the nodes at most once, so it costs time proportional to the number of
nodes and requests, not to the number of prompt tokens; the DFS auctions walk only the nodes that
changed since their last round (each node keeps the tree's version at its last change).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any, final

from .requests import WaitingRequest, bid_checked, to_ticks

INF = float("inf")

# Incremental planners (settings: policy, reserve, overhead) whose state the nodes keep at once.
PLAN_TOKENS = 8

# A request's place in the bid order (``RequestTree.by_bid``): minus its bid in ticks, then its
# (arrival, id).
BidKey = tuple[int, tuple[float, str]]

# Slices shorter than this are compared token by token; longer ones by bisecting on slice equality.
_SHORT_EDGE = 16


# Final: the planners tell nodes from entries by ``type(x) is Node`` (a faster test than
# isinstance), which the type checker reads both ways only for classes with no subclasses.
@final
class Node:
    """A node of the request tree; its edge holds tokens ``seq[start:end]``.

    A node holds the tree's state, and what incremental planners keep about it between rounds
    (``memo``, one state per planner setting, so that rounds cleared on one tree with different
    settings do not overwrite each other); a round's own scratch lives in its Plan (plan.py).
    """

    __slots__ = (
        "parent",
        "children",  # first token of the child's edge -> child
        "seq",  # token tuple of some request at or below this node
        "start",
        "end",
        "reqs",  # request id -> Entry, for the requests that end exactly here
        # Kept up to date by the tree:
        "cached",  # deepest cached position among the requests below (tokens)
        "ew",  # uncached tokens of this node's edge
        "size",  # requests in the subtree: 1 exactly for a leaf holding one request (not root)
        # Kept by the engines' prefill batch (begin_batch): the stamp of the last batch whose
        # requests compute this node's prefix. A batch is the engine's admission loop's, started
        # on the tree and known to no Clearing, so this is tree state, not a round's; rounds
        # never touch it (lpm's in-batch check keeps a set of its own).
        "mark",
        # The tree's version at the last change in this subtree (a request in or out, a bid or a
        # cached length changed, the edge cut or merged): what an incremental planner compares
        # with the version it last planned the node at.
        "changed",
        # The children whose ``changed`` moved since version ``noted_since`` (repeats
        # possible), so that a planner that last planned the node at or after that version
        # finds its changed children without reading every child; None: not kept (the node
        # is new, or the list grew as long as its children, when reading them all costs no
        # more). The planner starts it again at each node it plans.
        "noted",
        "noted_since",
        # An incremental planner's state at this node, by planner token (dfs_auction._dfs_states);
        # None until one plans it. It lives and dies with the node.
        "memo",
    )

    def __init__(self, parent: Node | None, seq: Sequence[int], start: int, end: int) -> None:
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.seq = seq
        self.start = start
        self.end = end
        self.reqs: dict[str, Entry] = {}
        self.cached = 0
        self.ew = end - start
        self.size = 0
        self.mark = -1
        self.changed = 0
        self.noted: list[Node] | None = None
        self.noted_since = 0
        # By planner token; each state of its planner's own type (dfs_auction._Memo), which
        # the planner names where it reads one: this module cannot import it (a cycle).
        self.memo: dict[int, Any] | None = None

    def set_cached(self, cached: int) -> None:
        """Set the deepest cached position below this node, and so its edge's uncached tokens."""
        self.cached = cached
        end = self.end
        self.ew = 0 if cached >= end else end - (cached if cached > self.start else self.start)

    def edge_cached(self) -> bool:
        """Part of this node's edge is already in the KV cache (what the KV auctions' keys
        boost, plan.block_cached; the root has no edge)."""
        return self.ew < self.end - self.start

    def fully_cached(self) -> bool:
        """Its whole edge is in the KV cache, and it holds several requests (not the root):
        serving its subtree as one block saves no prefill work, so dfs-auction-kv-split serves
        the blocks inside it as its parent's."""
        return self.cached >= self.end and self.size > 1 and self.parent is not None

    def recount_cached(self) -> int:
        """The deepest cached position below, from the requests here and the children."""
        cached = 0
        for e in self.reqs.values():
            if e.req.cached_len > cached:
                cached = e.req.cached_len
        for c in self.children.values():
            if c.cached > cached:
                cached = c.cached
        return cached


def _note(parent: Node, child: Node) -> None:
    """``child``'s ``changed`` just moved: its parent notes it (``Node.noted``)."""
    noted = parent.noted
    if noted is not None:
        if len(noted) < len(parent.children):
            noted.append(child)
        else:
            parent.noted = None


@final
class Entry:
    """A request in the tree: the request, the node where it ends, its tie-breaking key
    (arrival, id), its bid in whole ticks (requests.BID_SCALE), kept up to date by ``update``,
    and the engine's own handle on it (``RequestTree.insert``'s ``handle``; None if not given).
    ``credit``: its age credit in ticks (aging.py; 0 unless the tree's ``set_credit`` gave one),
    which the DFS auctions add to its bid in their keys and the charges keep apart from it.
    ``slot``: its place in the tree's array of bids (``RequestTree.bid_ticks``). ``owner``: its
    tenant tag (the request's, which never changes), beside its credit for the order book,
    which reads both of every request it shows."""

    __slots__ = ("req", "node", "tie", "ticks", "handle", "credit", "slot", "owner")

    def __init__(self, req: WaitingRequest, node: Node, handle: object = None) -> None:
        self.req = req
        self.node = node
        self.tie = (req.arrival, req.id)
        self.ticks = to_ticks(req.bid)
        self.handle = handle
        self.credit = 0
        self.slot = -1
        self.owner = req.owner


def common_len(a: Sequence[int], b: Sequence[int], lo: int, hi: int) -> int:
    """Length of the common run of ``a`` and ``b`` starting at position ``lo``, capped at ``hi``."""
    if hi - lo <= _SHORT_EDGE:
        i = lo
        while i < hi and a[i] == b[i]:
            i += 1
        return i - lo
    if a[lo:hi] == b[lo:hi]:
        return hi - lo
    good, bad = lo, hi  # a[lo:good] == b[lo:good]; a[lo:bad] != b[lo:bad]
    while bad - good > _SHORT_EDGE:
        mid = (good + bad) // 2
        if a[good:mid] == b[good:mid]:
            good = mid
        else:
            bad = mid
    while a[good] == b[good]:
        good += 1
    return good - lo


class RequestTree:
    """The waiting requests' prefix tree, kept up to date as requests arrive and leave."""

    def __init__(self, requests: Sequence[WaitingRequest] = ()) -> None:
        self.root = Node(None, (), 0, 0)
        self.entries: dict[str, Entry] = {}
        self.version = 0  # bumped by every change; a Clearing is valid while it stays the same
        self.stamp = 0  # counter for prefill batches (begin_batch)
        # The requests by (-bid ticks, arrival, id), kept from its first use on (highest-bid's
        # order without a sort per round): keys and entries side by side.
        self._bid_keys: list[BidKey] | None = None
        self._bid_entries: list[Entry] = []
        # Every waiting request's bid in ticks, as floats, one slot each in no order
        # (``bid_ticks``), and the entry in each slot: the order book reads the bids' spread
        # from one array, not from thousands of entries scattered in memory.
        self._ticks = array("d")
        self._slotted: list[Entry] = []
        # The type of the requests' token sequences (tuple or array("q")), set by the first:
        # edges are compared as slices, and a tuple slice never equals an array's.
        self._token_type: type[Sequence[int]] | None = None
        # Incremental planners' tokens by their key (``plan_token``), the most recent last.
        self._plan_tokens: dict[tuple[object, ...], int] = {}
        self._last_token = 0
        for req in requests:
            self.insert(req)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.entries

    def __iter__(self) -> Iterator[WaitingRequest]:
        return (e.req for e in self.entries.values())

    def get(self, request_id: str) -> WaitingRequest:
        """The waiting request with this id; KeyError if it is not waiting."""
        return self.entries[request_id].req

    def insert(self, req: WaitingRequest, handle: object = None) -> None:
        """Add a waiting request, with the engine's ``handle`` on it (kept in its Entry, for the
        engine to read back from a round's order). Time proportional to its number of tokens."""
        if not isinstance(req, WaitingRequest):
            raise ValueError(f"expected a WaitingRequest, got {type(req).__name__}")
        if req.id in self.entries:
            raise ValueError(f"duplicate request id {req.id!r}")
        toks = req.tokens
        if self._token_type is None:
            self._token_type = type(toks)
        elif type(toks) is not self._token_type:  # one type per tree: slices compare as equal
            req = replace(req, tokens=self._tokens(toks))
            toks = req.tokens
        length = len(toks)
        v = self.version + 1
        node, depth = self.root, 0
        node.size += 1  # every node entered on the way down holds the request below it
        node.changed = v
        while depth < length:
            child = node.children.get(toks[depth])
            if child is None:
                leaf = Node(node, toks, depth, length)
                leaf.size = 1
                leaf.changed = v
                node.children[toks[depth]] = leaf
                _note(node, leaf)
                node, depth = leaf, length
                break
            k = common_len(child.seq, toks, depth, min(child.end, length))
            if depth + k == child.end:
                _note(node, child)
                node, depth = child, child.end
                node.size += 1
                node.changed = v
                continue
            # The request leaves (or ends inside) the child's edge: split the edge there.
            cut = depth + k
            mid = Node(node, child.seq, depth, cut)
            mid.size = child.size + 1
            mid.changed = v
            node.children[toks[depth]] = mid
            _note(node, mid)
            child.parent, child.start = mid, cut
            child.changed = v
            child.set_cached(child.cached)
            mid.children[child.seq[cut]] = child
            mid.set_cached(child.cached)
            node, depth = mid, cut
        entry = Entry(req, node, handle)
        node.reqs[req.id] = entry
        self.entries[req.id] = entry
        self._raise_cached(node, req.cached_len)
        self._bid_file(entry)
        entry.slot = len(self._slotted)
        self._slotted.append(entry)
        self._ticks.append(entry.ticks)
        self.version += 1

    def _tokens(self, tokens: Sequence[int]) -> Sequence[int]:
        """``tokens`` as the tree's token type (ValueError if they do not fit one)."""
        if self._token_type is array:
            try:
                return array("q", tokens)
            except (OverflowError, TypeError) as exc:
                raise ValueError(f"token ids must be 64-bit integers: {exc}") from None
        return tuple(tokens)

    def plan_token(self, key: tuple[object, ...]) -> int:
        """The token under which an incremental planner with settings ``key`` keeps its state
        in the nodes (``Node.memo``). The tree keeps the ``PLAN_TOKENS`` most recent; an older
        key gets a new token, so its planner starts over instead of reading stale state."""
        tokens = self._plan_tokens
        token = tokens.pop(key, None)
        if token is None:
            if len(tokens) >= PLAN_TOKENS:
                del tokens[next(iter(tokens))]
            self._last_token += 1
            token = self._last_token
        tokens[key] = token  # most recent last
        return token

    def live_tokens(self) -> set[int]:
        """The planner tokens in use (``plan_token``); a node's state under another is stale."""
        return set(self._plan_tokens.values())

    def by_bid(self) -> tuple[list[BidKey], list[Entry]]:
        """The waiting requests by highest bid, then earliest (arrival, id): their sort keys
        ``(-ticks, (arrival, id))`` and entries, in that order. Kept up to date from the first
        call on; do not modify."""
        if self._bid_keys is None:
            entries = sorted(self.entries.values(), key=lambda e: (-e.ticks, e.tie))
            self._bid_keys = [(-e.ticks, e.tie) for e in entries]
            self._bid_entries = entries
        return self._bid_keys, self._bid_entries

    def bid_ticks(self) -> array[float]:
        """The waiting requests' bids in ticks, as floats (exact: ticks stay below 2**53), one
        each, in no order; do not modify."""
        return self._ticks

    def _bid_file(self, entry: Entry) -> None:
        if self._bid_keys is not None:
            key = (-entry.ticks, entry.tie)
            i = bisect_right(self._bid_keys, key)
            self._bid_keys.insert(i, key)
            self._bid_entries.insert(i, entry)

    def _bid_unfile(self, entry: Entry) -> None:
        if self._bid_keys is not None:
            i = bisect_left(self._bid_keys, (-entry.ticks, entry.tie))
            if i == len(self._bid_entries) or self._bid_entries[i] is not entry:
                raise RuntimeError(f"the bid order lost request {entry.req.id!r}")
            del self._bid_keys[i]
            del self._bid_entries[i]

    @staticmethod
    def _raise_cached(x: Node | None, cached: int) -> None:
        """A request below ``x`` is cached up to ``cached``: raise the nodes above it."""
        while x is not None and x.cached < cached:
            x.set_cached(cached)
            x = x.parent

    @staticmethod
    def _lower_cached(x: Node | None, gone: int) -> None:
        """A cached depth ``gone`` below ``x`` went away or shrank: recount where it was the max."""
        while x is not None and x.cached == gone:
            now = x.recount_cached()
            if now == gone:
                return
            x.set_cached(now)
            x = x.parent

    def remove(self, request_id: str) -> WaitingRequest:
        """Remove a waiting request (served or cancelled) and return it."""
        entry = self._waiting(request_id)
        del self.entries[request_id]
        self._bid_unfile(entry)
        last, ticks = self._slotted.pop(), self._ticks.pop()  # the last slot fills the gap
        if last is not entry:
            self._slotted[entry.slot] = last
            self._ticks[entry.slot] = ticks
            last.slot = entry.slot
        node = entry.node
        del node.reqs[request_id]
        v = self.version + 1
        x: Node | None = node
        while x is not None:
            x.size -= 1
            x.changed = v
            if (up := x.parent) is not None:
                _note(up, x)
            x = up
        root = self.root
        gone = entry.req.cached_len
        # Keep the trie compressed: drop empty leaves, merge nodes left with one child.
        while node is not root and not node.reqs:
            parent = node.parent
            assert parent is not None  # only the root has none, and the walk stops below it
            if not node.children:
                del parent.children[node.seq[node.start]]
                if parent.cached == node.cached:
                    gone = node.cached
                node = parent
                continue
            if len(node.children) == 1:
                (child,) = node.children.values()
                child.start, child.parent = node.start, parent
                child.changed = v
                _note(parent, child)
                child.set_cached(child.cached)
                parent.children[child.seq[child.start]] = child
                node = parent
            break
        self._lower_cached(node, gone)
        self.version += 1
        return entry.req

    def update(
        self, request_id: str, *, bid: float | None = None, cached_len: int | None = None
    ) -> WaitingRequest:
        """Change a waiting request's bid or cached length in place and return the new request."""
        entry = self._waiting(request_id)
        req = entry.req
        old = req.cached_len
        if bid is None:  # the cached length alone (the engines' common case): no re-filing
            req = req.with_cached_len(old if cached_len is None else cached_len)
        else:
            req = replace(
                req,
                bid=bid_checked(bid, request_id=request_id),
                cached_len=old if cached_len is None else cached_len,
            )
            self._bid_unfile(entry)
            entry.ticks = to_ticks(req.bid)
            self._ticks[entry.slot] = entry.ticks
            self._bid_file(entry)
        entry.req = req
        self._changed_at(entry.node)
        new = req.cached_len
        if new > old:
            self._raise_cached(entry.node, new)
        elif new < old:
            self._lower_cached(entry.node, old)
        return entry.req

    def set_credit(self, request_id: str, credit: int) -> None:
        """Give a waiting request an age credit of ``credit`` bid ticks (aging.py): the change
        reaches the incremental planners as a change of its node, like a bid's."""
        entry = self._waiting(request_id)
        if isinstance(credit, bool) or not isinstance(credit, int) or credit < 0:
            raise ValueError(f"request {request_id!r}: credit must be an int >= 0, got {credit!r}")
        entry.credit = credit
        self._changed_at(entry.node)

    def credit_entries(self, credits: Iterable[tuple[Entry, int]]) -> None:
        """New age credits for many of this tree's entries at once, as one change of the tree
        (one version): each path is marked up to where an earlier one of the batch marked it
        already, so a round's credit steps cost their requests, not their depth times their
        number. Unchecked: for the age clock, which reads the entries from the tree and works
        the credits out itself as ints >= 0 (``set_credit`` checks one)."""
        v = self.version + 1
        for entry, credit in credits:
            entry.credit = credit
            x: Node | None = entry.node
            while x is not None and x.changed != v:
                x.changed = v
                if (up := x.parent) is not None:
                    _note(up, x)
                x = up
        self.version = v

    def _waiting(self, request_id: str) -> Entry:
        entry = self.entries.get(request_id)
        if entry is None:
            raise ValueError(f"request {request_id!r} is not waiting")
        return entry

    def _changed_at(self, x: Node | None) -> None:
        """A request at ``x`` changed: so did ``x`` and the nodes above it, in a new version."""
        v = self.version = self.version + 1
        while x is not None:
            x.changed = v
            if (up := x.parent) is not None:
                _note(up, x)
            x = up

    # --- in-batch sharing (for the engines' admission loop) -----------------------------------

    def begin_batch(self) -> int:
        """Start a prefill batch: returns a stamp for ``batch_recomputed`` and ``batch_add``."""
        self.stamp += 1
        self.root.mark = self.stamp
        return self.stamp

    def batch_recomputed(self, request_id: str, stamp: int) -> int:
        """Uncached tokens the request shares with the requests added to the batch ``stamp``:
        what admitting it to that batch would compute a second time (<= 0: nothing)."""
        entry = self.entries[request_id]
        x: Node | None = entry.node
        while x is not None and x.mark != stamp:  # the batch marks the root, at least
            x = x.parent
        if x is None:
            raise _stale_batch(stamp)
        return x.end - entry.req.cached_len

    def batch_add(self, request_id: str, stamp: int) -> None:
        """Add a request to the batch ``stamp``: its prefix counts as being computed."""
        x: Node | None = self.entries[request_id].node
        if self.root.mark != stamp:  # checked first, so that a stale stamp marks nothing
            raise _stale_batch(stamp)
        while x is not None and x.mark != stamp:  # the root is marked: the walk stops there
            x.mark = stamp
            x = x.parent

    def sharing(self, tokens: Sequence[int], depth: int) -> list[tuple[Entry, int]]:
        """The waiting requests whose first ``depth`` tokens are ``tokens[:depth]``, each with
        the length of its common prefix with ``tokens`` (at least ``depth``).

        Time proportional to the nodes on the way down and the requests found: what an engine
        needs when a cache insert or eviction along ``tokens`` changes the cached lengths of
        exactly these requests.
        """
        if not self.entries:
            return []
        toks = tokens if type(tokens) is self._token_type else self._tokens(tokens)
        length = len(toks)
        if depth > length:
            return []
        x, pos = self.root, 0  # toks[:pos] is the path down to x's end
        while pos < depth:
            child = x.children.get(toks[pos])
            if child is None:
                return []
            k = common_len(child.seq, toks, pos, min(child.end, length))
            if pos + k < child.end:  # the path leaves toks (or toks ends) inside this edge
                if pos + k < depth:
                    return []
                return [(e, pos + k) for e in entries_below(child)]
            x, pos = child, child.end
        out: list[tuple[Entry, int]] = []
        stack = [x]  # nodes whose path is a prefix of toks
        while stack:
            y = stack.pop()
            end = y.end
            for e in y.reqs.values():
                out.append((e, end))
            for c in y.children.values():
                k = common_len(c.seq, toks, c.start, min(c.end, length)) if end < length else 0
                if c.start + k == c.end:
                    stack.append(c)
                else:
                    m = c.start + k
                    out.extend((e, m) for e in entries_below(c))
        return out

    def nodes(self) -> list[Node]:
        """All nodes, parents before children (breadth-first)."""
        out = [self.root]
        i = 0
        while i < len(out):
            out.extend(out[i].children.values())
            i += 1
        return out

    def path(self, request_id: str) -> list[Node]:
        """The nodes from the root down to the node where the request ends."""
        node: Node | None = self.entries[request_id].node
        out: list[Node] = []
        while node is not None:
            out.append(node)
            node = node.parent
        out.reverse()
        return out


def _stale_batch(stamp: int) -> ValueError:
    return ValueError(f"batch {stamp} is not the tree's current batch (begin_batch)")


def entries_below(x: Node) -> list[Entry]:
    """The requests in the subtree of ``x``, as a list: the book reads it for each subtree it
    shows, and a list built in one pass costs half what a generator's yields do (most nodes
    are leaves, one request and no children)."""
    out = list(x.reqs.values())
    extend = out.extend
    stack = list(x.children.values())
    pop = stack.pop
    push = stack.extend
    while stack:
        y = pop()
        extend(y.reqs.values())
        if y.children:
            push(y.children.values())
    return out
