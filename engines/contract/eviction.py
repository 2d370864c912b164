"""Which cached prefixes an engine evicts first under a DFS auction: the one rule both engines run.

A radix cache under pressure evicts its least recently used leaves. Under a DFS auction that
drops the prefix of a subtree that is still waiting (its requests come later in the round's
order, so its prefix was touched long ago) while it keeps the tails of finished requests that
nobody waits for; the waiting subtree then computes its prefix again. So the auctions evict in
this order instead:

1. leaves that no waiting request's cached prefix reaches, least recently used first (the
   cache's own priority);
2. then the prefixes of waiting requests, the one whose first waiting request comes last in the
   round's order first: what will be needed last goes first.

A leaf is needed when evicting it would shorten some waiting request's cached prefix; its rank
is the position of the first such request in the round's order. ``waiting_ranks`` works them
out from the nodes where the waiting requests' matches end (the simulated engine, whose matches
split the cache's edges there); the SGLang plugin finds a leaf's requests in the request tree by
its tokens. ``eviction_priority`` is the key a cache evicts by, lowest first (the shape of
SGLang's ``EvictionStrategy.get_priority``).
Neither reads a bid: which prefix goes depends on the order, which the auction fixed before
anyone was admitted, and an order position can only protect a prefix, never charge for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class CacheNode(Protocol):
    """A node of a radix KV cache: each engine's own (``parent`` None at the root)."""

    @property
    def parent(self) -> CacheNode | None: ...


def waiting_ranks(match_ends: Iterable[CacheNode | None]) -> dict[CacheNode, int]:
    """The round's rank of every cache node on the cached prefix of a waiting request: the
    position of the first request in ``match_ends`` (the node where each
    waiting request's cache match ends, in the round's order; None: no match) whose prefix
    runs through it. Time proportional to the requests and the nodes on their paths."""
    ranks: dict[CacheNode, int] = {}
    for pos, node in enumerate(match_ends):
        while node is not None and node not in ranks:
            ranks[node] = pos
            node = node.parent
    return ranks


def eviction_priority(rank: int | None, base: object) -> tuple[int, int, object]:
    """The key a cache evicts a leaf by, lowest first, given its ``rank`` in the round (the
    position of the first waiting request whose cached prefix evicting it would shorten; None:
    no waiting request's) and the cache's own ``base`` priority (its LRU time): leaves no
    waiting request needs before the others, by ``base``; then the needed ones, the latest in
    the round's order first."""
    if rank is None:
        return (0, 0, base)
    return (1, -rank, base)
