"""The request tree: a compressed trie over the token ids of the waiting requests.

Every waiting request ends at a node. A node's edge covers the token positions ``start..end`` of
every request below it; edges keep a reference to one such request's token tuple instead of a copy,
so inserting or removing a request costs time proportional to its length (token comparisons run as
slice comparisons in C). Requests that share a prefix share the nodes of that prefix whether or not
it is cached yet. How much of an edge is cached follows from the requests' ``cached_len`` (a
token cached for one request is cached for every request with the same prefix): each node keeps
the deepest cached position below it, updated on the way up by every insert, removal and update.

A scheduling round walks the nodes at most once, so it costs time proportional to the number of
nodes and requests, not to the number of prompt tokens.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import replace

from .requests import WaitingRequest, bid_checked, to_ticks

INF = float("inf")

# Slices shorter than this are compared token by token; longer ones by bisecting on slice equality.
_SHORT_EDGE = 16


class Node:
    """A node of the request tree; its edge holds tokens ``seq[start:end]``.

    A node holds the tree's state only. What a round works out about it (its block, its key, its
    place in the order) lives in that round's Plan (plan.py), so that rounds cleared on one tree
    do not overwrite each other.
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

    def set_cached(self, cached: int) -> None:
        """Set the deepest cached position below this node, and so its edge's uncached tokens."""
        self.cached = cached
        end = self.end
        self.ew = 0 if cached >= end else end - (cached if cached > self.start else self.start)

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


class Entry:
    """A request in the tree: the request, the node where it ends, its tie-breaking key
    (arrival, id) and its bid in whole ticks (requests.BID_SCALE), kept up to date by ``update``."""

    __slots__ = ("req", "node", "tie", "ticks")

    def __init__(self, req: WaitingRequest, node: Node) -> None:
        self.req = req
        self.node = node
        self.tie = (req.arrival, req.id)
        self.ticks = to_ticks(req.bid)


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
        self._bid_keys: list[tuple] | None = None
        self._bid_entries: list[Entry] = []
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

    def insert(self, req: WaitingRequest) -> None:
        """Add a waiting request. Time proportional to its number of tokens."""
        if not isinstance(req, WaitingRequest):
            raise ValueError(f"expected a WaitingRequest, got {type(req).__name__}")
        if req.id in self.entries:
            raise ValueError(f"duplicate request id {req.id!r}")
        toks = req.tokens
        length = len(toks)
        node, depth = self.root, 0
        node.size += 1  # every node entered on the way down holds the request below it
        while depth < length:
            child = node.children.get(toks[depth])
            if child is None:
                leaf = Node(node, toks, depth, length)
                leaf.size = 1
                node.children[toks[depth]] = leaf
                node, depth = leaf, length
                break
            k = common_len(child.seq, toks, depth, min(child.end, length))
            if depth + k == child.end:
                node, depth = child, child.end
                node.size += 1
                continue
            # The request leaves (or ends inside) the child's edge: split the edge there.
            cut = depth + k
            mid = Node(node, child.seq, depth, cut)
            mid.size = child.size + 1
            node.children[toks[depth]] = mid
            child.parent, child.start = mid, cut
            child.set_cached(child.cached)
            mid.children[child.seq[cut]] = child
            mid.set_cached(child.cached)
            node, depth = mid, cut
        entry = Entry(req, node)
        node.reqs[req.id] = entry
        self.entries[req.id] = entry
        self._raise_cached(node, req.cached_len)
        self._bid_file(entry)
        self.version += 1

    def by_bid(self) -> tuple[list[tuple], list[Entry]]:
        """The waiting requests by highest bid, then earliest (arrival, id): their sort keys
        ``(-ticks, (arrival, id))`` and entries, in that order. Kept up to date from the first
        call on; do not modify."""
        if self._bid_keys is None:
            entries = sorted(self.entries.values(), key=lambda e: (-e.ticks, e.tie))
            self._bid_keys = [(-e.ticks, e.tie) for e in entries]
            self._bid_entries = entries
        return self._bid_keys, self._bid_entries

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
        entry = self.entries.pop(request_id, None)
        if entry is None:
            raise ValueError(f"request {request_id!r} is not waiting")
        self._bid_unfile(entry)
        node = entry.node
        del node.reqs[request_id]
        x = node
        while x is not None:
            x.size -= 1
            x = x.parent
        root = self.root
        gone = entry.req.cached_len
        # Keep the trie compressed: drop empty leaves, merge nodes left with one child.
        while node is not root and not node.reqs:
            parent = node.parent
            if not node.children:
                del parent.children[node.seq[node.start]]
                if parent.cached == node.cached:
                    gone = node.cached
                node = parent
                continue
            if len(node.children) == 1:
                (child,) = node.children.values()
                child.start, child.parent = node.start, parent
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
        entry = self.entries.get(request_id)
        if entry is None:
            raise ValueError(f"request {request_id!r} is not waiting")
        changes: dict[str, object] = {}
        if bid is not None:
            changes["bid"] = bid_checked(bid, request_id=request_id)
        if cached_len is not None:
            changes["cached_len"] = cached_len
        old = entry.req.cached_len
        self._bid_unfile(entry)
        entry.req = replace(entry.req, **changes)
        entry.ticks = to_ticks(entry.req.bid)
        self._bid_file(entry)
        new = entry.req.cached_len
        if new > old:
            self._raise_cached(entry.node, new)
        elif new < old:
            self._lower_cached(entry.node, old)
        self.version += 1
        return entry.req

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
        x = entry.node
        while x.mark != stamp:
            x = x.parent
        return x.end - entry.req.cached_len

    def batch_add(self, request_id: str, stamp: int) -> None:
        """Add a request to the batch ``stamp``: its prefix counts as being computed."""
        x = self.entries[request_id].node
        while x.mark != stamp:
            x.mark = stamp
            x = x.parent

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
        node = self.entries[request_id].node
        out = []
        while node is not None:
            out.append(node)
            node = node.parent
        out.reverse()
        return out
