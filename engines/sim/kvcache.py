"""The simulated engine's KV cache: a radix tree of token ids with LRU eviction, as SGLang's.

Nodes hold token ranges ``seq[start:end]`` of some sequence (no copies). Running requests lock
the nodes of their prefix (a lock covers the path to the root); only unlocked leaves are
evicted, least recently used first, through a lazy heap (stale entries are skipped on pop).

Token accounting (all in tokens): ``size`` tokens live in the tree, ``evictable`` of them
unlocked. ``capacity`` bounds the tree plus what running requests hold outside it (their
generated tokens and what they have reserved but not yet computed); the engine keeps that sum.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from engines.contract.eviction import eviction_priority
from mechanism.tree import common_len


class KVNode:
    """A node of the KV radix tree; its edge holds tokens ``seq[start:end]``."""

    __slots__ = ("parent", "children", "seq", "start", "end", "lock", "last_access", "alive")

    def __init__(self, parent: KVNode | None, seq: Sequence[int], start: int, end: int) -> None:
        self.parent = parent
        self.children: dict[int, KVNode] = {}
        self.seq = seq
        self.start = start
        self.end = end
        self.lock = 0
        self.last_access = 0
        self.alive = True


class KVCache:
    """Radix tree of cached token ids with lock counts and LRU eviction."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.root = KVNode(None, (), 0, 0)
        self.root.lock = 1  # never evicted
        self.size = 0
        self.evictable = 0
        self._clock = itertools.count(1)
        self._heap: list[tuple[int, int, KVNode]] = []
        self._tiebreak = itertools.count()
        # Nodes that got a child or were evicted since the engine last looked: a match that
        # ended at one of them may now go further, or no longer reach it.
        self.changed: set[KVNode] = set()

    # --- lookups ---------------------------------------------------------------------------

    def match(self, tokens: Sequence[int], limit: int | None = None) -> tuple[int, KVNode]:
        """Longest cached prefix of ``tokens[:limit]``: (its length, the node it ends at).

        A match that ends inside an edge splits the edge there, as SGLang's does, so the node
        returned ends exactly at the match. Touches the matched nodes for LRU.
        """
        end = len(tokens) if limit is None else min(limit, len(tokens))
        node, depth = self.root, 0
        now = next(self._clock)
        while depth < end:
            child = node.children.get(tokens[depth])
            if child is None:
                break
            k = common_len(child.seq, tokens, depth, min(child.end, end))
            if depth + k < child.end:
                child = self._split(child, depth + k)
            self._touch(child, now)
            node, depth = child, child.end
        return depth, node

    def _touch(self, node: KVNode, now: int) -> None:
        node.last_access = now
        if not node.children and node.lock == 0:
            heapq.heappush(self._heap, (now, next(self._tiebreak), node))

    def _split(self, child: KVNode, cut: int) -> KVNode:
        """Split ``child``'s edge at depth ``cut``; return the new upper node."""
        parent = child.parent
        mid = KVNode(parent, child.seq, child.start, cut)
        mid.lock = child.lock
        mid.last_access = child.last_access
        parent.children[child.seq[child.start]] = mid
        child.parent, child.start = mid, cut
        mid.children[child.seq[cut]] = child
        return mid

    # --- changes ---------------------------------------------------------------------------

    def insert(self, tokens: Sequence[int], end: int) -> tuple[int, KVNode]:
        """Cache ``tokens[:end]``; return (tokens newly added, the node at ``end``).

        The caller makes room first (``evict``). Tokens already cached are not added twice.
        """
        depth, node = self.match(tokens, end)
        if depth >= end:
            return 0, node
        leaf = KVNode(node, tokens, depth, end)
        leaf.last_access = next(self._clock)
        node.children[tokens[depth]] = leaf
        self.changed.add(node)
        added = end - depth
        self.size += added
        self.evictable += added
        # ``node`` is no longer a leaf: its heap entries go stale (evict skips them).
        heapq.heappush(self._heap, (leaf.last_access, next(self._tiebreak), leaf))
        return added, leaf

    def lock(self, node: KVNode) -> None:
        """Protect ``node`` and its ancestors from eviction."""
        while node is not None:
            if node.lock == 0:
                self.evictable -= node.end - node.start
            node.lock += 1
            node = node.parent

    def unlock(self, node: KVNode) -> None:
        """Undo one ``lock``; nodes left unlocked become evictable."""
        while node is not None:
            node.lock -= 1
            if node.lock == 0:
                self.evictable += node.end - node.start
                if not node.children:
                    heapq.heappush(self._heap, (node.last_access, next(self._tiebreak), node))
            node = node.parent

    def evict(self, tokens: int, ranks: dict[KVNode, int] | None = None) -> int:
        """Evict unlocked leaves until ``tokens`` are freed; return freed. Least recently used
        first, or with ``ranks`` (a DFS auction's round: eviction.waiting_ranks) by
        ``eviction_priority``: leaves no waiting request needs first, then the prefixes needed
        last."""
        if ranks is not None:
            return self._evict_by_order(tokens, ranks)
        freed = 0
        heap = self._heap
        while freed < tokens and heap:
            stamp, _, node = heapq.heappop(heap)
            if not self._evictable(node, stamp):
                continue
            freed += self._delete(node)
        return freed

    def _evictable(self, node: KVNode, stamp: int) -> bool:
        """Whether a heap entry of ``stamp`` is an evictable leaf still (the heap is lazy)."""
        return (
            node.alive
            and not node.children
            and not node.lock
            and node.last_access == stamp
            and node.parent is not None
        )

    def _delete(self, node: KVNode) -> int:
        """Evict the leaf ``node``; its parent becomes a candidate. Returns the tokens freed."""
        parent = node.parent
        assert parent is not None
        del parent.children[node.seq[node.start]]
        node.alive = False
        self.changed.add(node)
        n = node.end - node.start
        self.size -= n
        self.evictable -= n
        if not parent.children and parent.lock == 0 and parent.parent is not None:
            heapq.heappush(self._heap, (parent.last_access, next(self._tiebreak), parent))
        return n

    def _evict_by_order(self, tokens: int, ranks: dict[KVNode, int]) -> int:
        """``evict`` by the round's order: every evictable leaf keyed at once, as SGLang's
        RadixCache.evict heaps its evictable leaves by its strategy's priority."""
        leaves: dict[KVNode, None] = {}
        for stamp, _, node in self._heap:
            if self._evictable(node, stamp):
                leaves[node] = None
        self._heap = []
        tick = self._tiebreak
        order = [(eviction_priority(ranks.get(x), x.last_access), next(tick), x) for x in leaves]
        heapq.heapify(order)
        freed = 0
        while freed < tokens and order:
            _, _, node = heapq.heappop(order)
            parent = node.parent
            freed += self._delete(node)
            if parent is not None and self._heap:  # it became a leaf: a candidate now
                self._heap.pop()
                key = eviction_priority(ranks.get(parent), parent.last_access)
                heapq.heappush(order, (key, next(tick), parent))
        # What is left goes back to the LRU heap (the next eviction keys it afresh).
        self._heap = [(x.last_access, i, x) for _, i, x in order]
        heapq.heapify(self._heap)
        return freed


class ComputedPrefixes:
    """Every prefix the engine has computed, never evicted: a radix tree of token ids without
    locks or LRU, for counting what is computed again after an eviction
    (``Engine.recomputed_prompt_tokens``: a prompt's prefix found here but not in the cache)."""

    def __init__(self) -> None:
        self.root = KVNode(None, (), 0, 0)

    def match(self, tokens: Sequence[int], limit: int) -> int:
        """Length of the longest computed prefix of ``tokens[:limit]`` (tokens)."""
        end = min(limit, len(tokens))
        node, depth = self.root, 0
        while depth < end:
            child = node.children.get(tokens[depth])
            if child is None:
                break
            k = common_len(child.seq, tokens, depth, min(child.end, end))
            if depth + k < child.end:
                return depth + k
            node, depth = child, child.end
        return depth

    def insert(self, tokens: Sequence[int], end: int) -> None:
        """Record ``tokens[:end]`` as computed."""
        node, depth = self.root, 0
        while depth < end:
            child = node.children.get(tokens[depth])
            if child is None:
                node.children[tokens[depth]] = KVNode(node, tokens, depth, end)
                return
            k = common_len(child.seq, tokens, depth, min(child.end, end))
            if depth + k < child.end:
                if depth + k == end:
                    return
                mid = KVNode(node, child.seq, depth, depth + k)
                node.children[tokens[depth]] = mid
                child.parent, child.start = mid, depth + k
                mid.children[child.seq[depth + k]] = child
                child = mid
            node, depth = child, child.end
