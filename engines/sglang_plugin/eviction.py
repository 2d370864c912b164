"""The radix cache evicts by the round's order under a DFS auction (engines.contract.eviction).

SGLang's ``RadixCache.evict`` heaps its evictable leaves by its ``eviction_strategy``'s
``get_priority`` (lowest first) on every call. ``OrderedEviction`` wraps the strategy of the
one cache the plugin follows (an instance attribute: SGLang's class and every other cache are
left alone): while the market runs a DFS auction with ``evict_by_order`` on, a leaf's priority is
``eviction_priority`` of its rank in the last round (``MarketQueue.leaf_rank``) and the wrapped
strategy's own; otherwise it is the wrapped strategy's, unchanged.

``eviction_strategy`` is a public attribute of SGLang 0.5.23's ``RadixCache``, read by ``evict``
alone; ``PRIVATE_SURFACE`` in cache_tracking.py lists the rest the plugin relies on.
"""

from __future__ import annotations

from typing import Any, Protocol

from engines.contract.eviction import eviction_priority


class RankedLeaves(Protocol):
    """What the strategy asks the market (MarketQueue)."""

    @property
    def evicts_by_order(self) -> bool: ...

    def leaf_rank(self, node: Any) -> int | None: ...


class OrderedEviction:
    """An ``EvictionStrategy`` for SGLang's radix cache: leaves no waiting request needs first,
    then the ones needed last in the round's order, each tier by ``base``'s priority."""

    def __init__(self, base: Any, market: RankedLeaves) -> None:
        self.base = base
        self.market = market

    def get_priority(self, node: Any, *args: Any, **kwargs: Any) -> Any:
        """The wrapped priority, ranked first by the round's order when the market says so."""
        base = self.base.get_priority(node, *args, **kwargs)
        market = self.market
        if not market.evicts_by_order:
            return base
        return eviction_priority(market.leaf_rank(node), base)


def install(cache: Any, market: RankedLeaves) -> OrderedEviction:
    """Wrap ``cache``'s eviction strategy for ``market`` (once; returns the wrapper)."""
    strategy = cache.eviction_strategy
    if isinstance(strategy, OrderedEviction):
        return strategy
    wrapped = OrderedEviction(strategy, market)
    cache.eviction_strategy = wrapped
    return wrapped
