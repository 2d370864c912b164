"""The auction mechanism, pure Python (its rules: docs/mechanism.md).

It imports nothing from Django, Celery or SGLang: the engines and the SGLang plugin use it as is.

    from mechanism import WaitingRequest, clear, POLICIES
    c = clear(requests, "dfs-auction-density", reserve=0.01)
    c.order, c.completion, c.payments, c.planned_welfare

For a queue that changes request by request, keep a ``RequestTree`` and call ``clear_tree``.

Read it in this order: ``requests`` (the waiting request), ``tree`` (the request tree),
``plan`` (what one round works out, kept by the round, not the tree, and the key blocks go by),
``policies`` (the registry of ordering policies, ``POLICY``), ``dfs_auction`` and ``baselines``
(their planners), ``payments`` (priority charges), ``welfare`` (planned and realized welfare),
``clearing`` (one round). ``reference`` is the same mechanism written plainly, by brute force,
that the tests check this one against.
"""

from .clearing import DEFAULT_TOKENS_PER_SECOND, Clearing, clear, clear_tree
from .policies import (
    BID_POLICIES,
    DEFAULT_POLICY,
    DFS_AUCTIONS,
    OFFERED,
    POLICIES,
    POLICY,
    block_key,
    policy_checked,
    policy_offered,
)
from .requests import BID_SCALE, MAX_BID, WaitingRequest, bid_checked, to_ticks
from .tree import RequestTree
from .welfare import planned_welfare, realized_welfare

__all__ = [
    "BID_SCALE",
    "MAX_BID",
    "BID_POLICIES",
    "DEFAULT_POLICY",
    "DEFAULT_TOKENS_PER_SECOND",
    "DFS_AUCTIONS",
    "OFFERED",
    "POLICIES",
    "POLICY",
    "Clearing",
    "RequestTree",
    "WaitingRequest",
    "bid_checked",
    "block_key",
    "clear",
    "clear_tree",
    "planned_welfare",
    "policy_checked",
    "policy_offered",
    "realized_welfare",
    "to_ticks",
]
