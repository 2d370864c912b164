"""The ordering policies (docs/mechanism.md, "Orders and policies"), the KV auctions
(dfs-auction-kv and dfs-auction-kv-split) among them, as a registry from name to ``Policy``.

A ``Policy`` says in one place what the rest of the mechanism and the engines ask about a policy:
whether its order uses bids (and so charges for priority), whether it is a DFS order of the
request tree, the key its sibling blocks go by (plan.BlockKey), the planner that orders a round,
how the round's priority charges are worked out, and whether operators may choose it for a
market (``offered``; the others are the baselines the benchmarks measure the market against).
``POLICY[name]`` looks one up; ``policy_checked`` checks a name from outside.

The planners live beside: dfs_auction.py for the DFS auctions (their state kept in the nodes
across rounds), baselines.py for the orders the auctions are measured against. Each takes the
policy, the reserve in bid ticks and the overhead tokens per request, reads the tree, writes
nothing into it, and returns the round's ``Plan`` (plan.py).

dfs-auction-kv is dfs-auction-density with one change, for KV pressure: a block whose edge is
already (partly) cached counts its size a ``KV_CACHED_BOOST``-th, so a subtree whose prefix is in
the cache is not pushed back (and evicted, and computed again) by a block that is only a little
denser. Whether an edge is cached does not depend on any bid, so the order stays monotone in each
request's bid and the charges are the same crossing points (payments.py).

dfs-auction-kv-split is dfs-auction-kv on the tree contracted at fully cached subtrees: a subtree
whose edge is wholly in the KV cache (``Node.fully_cached``) costs no prefill to keep together,
so it is no block of its own; its blocks go among its parent's, where they count as cached (they
sit right under a cached prefix). Its urgent requests can then go ahead of other subtrees while
its background ones wait, as under highest-bid, at no extra work. Which subtrees are split
depends on the cache alone, not on bids, and each block's work is still exactly what serving it
computes, so the order stays monotone and the charges are the same crossing points over the
contracted tree.

The default, and which policies are offered, is chosen by measurement (docs/benchmarks.md: the
market's goal over the KV sweep and the chat workload). dfs-auction-kv-split meets the goal on
the most points, and on no point does another auction meet it where it does not;
dfs-auction-density is offered for its cheaper rounds (mechanism.bench), lpm for a market that
does not auction. The others are the benchmarks' baselines: fcfs, lpm, dfs-weight and
highest-bid the orders a serving system ships, dfs-auction the published average-bid auction,
dfs-auction-kv the cached-edge boost alone (what the split adds to it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .baselines import plan_dfs_weight, plan_fcfs, plan_highest_bid, plan_lpm
from .dfs_auction import plan_dfs_auction
from .payments import ChargeRule, DfsCharges, FlatCharges
from .plan import BlockKey, Plan
from .tree import RequestTree

AVERAGE_BID = BlockKey("average bid", per_work=False)
BID_DENSITY = BlockKey("bid density", per_work=True)
# dfs-auction-kv: bid density where a block whose edge is already in the KV cache counts a
# quarter of its work. Under KV pressure a cached subtree that waits is evicted and computed
# again, at the cost of everyone behind it; this keeps it ahead unless an uncached block's
# density is 4x its own. The factor was chosen on the benchmark's KV-pressure sweep.
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
    dfs: bool  # every subtree of the request tree served as one block: a DFS order
    block_key: BlockKey | None  # what sibling blocks go by, for the DFS auctions
    planner: Planner  # orders one round
    charges: ChargeRule | None  # works out the round's priority charges (payments.py); None: free
    offered: bool  # operators may choose it for a market; else a baseline of the benchmarks

    def __str__(self) -> str:
        return self.name


# Planners take the policy, the reserve in bid ticks and the overhead tokens per request, and
# return the round's Plan; they read the tree and write nothing into it.
Planner = Callable[[RequestTree, Policy, int, int], Plan]

# The registry, in the order of docs/mechanism.md's table ("Orders and policies"). dfs-weight
# walks the tree of cached prefixes, not the request tree, so it is not ``dfs`` here.
# fmt: off
REGISTRY: tuple[Policy, ...] = (
    #      name                    bids   dfs    block_key    planner           charges      offered
    Policy("fcfs",                 False, False, None,        plan_fcfs,        None,        False),
    Policy("lpm",                  False, False, None,        plan_lpm,         None,        True),
    Policy("dfs-weight",           False, False, None,        plan_dfs_weight,  None,        False),
    Policy("highest-bid",          True,  False, None,        plan_highest_bid, FlatCharges, False),
    Policy("dfs-auction",          True,  True,  AVERAGE_BID, plan_dfs_auction, DfsCharges,  False),
    Policy("dfs-auction-density",  True,  True,  BID_DENSITY, plan_dfs_auction, DfsCharges,  True),
    Policy("dfs-auction-kv",       True,  True,  CACHE_KEPT,  plan_dfs_auction, DfsCharges,  False),
    Policy("dfs-auction-kv-split", True,  True,  CACHE_SPLIT, plan_dfs_auction, DfsCharges,  True),
)
# fmt: on

POLICY: dict[str, Policy] = {p.name: p for p in REGISTRY}
POLICIES: tuple[str, ...] = tuple(POLICY)
# What operators may choose for a market, and what a new market runs.
OFFERED: tuple[str, ...] = tuple(p.name for p in REGISTRY if p.offered)
DEFAULT_POLICY = "dfs-auction-kv-split"

# Policies whose order depends on bids, and so charge for priority.
BID_POLICIES = frozenset(p.name for p in REGISTRY if p.uses_bids)
# Policies that order blocks of the full request tree by a bid key.
DFS_AUCTIONS = frozenset(p.name for p in REGISTRY if p.dfs and p.block_key is not None)


def policy_checked(policy: object) -> str:
    """Return the policy name, or raise ValueError naming it if it is unknown."""
    if not isinstance(policy, str) or policy not in POLICY:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    return policy


def policy_offered(policy: object) -> str:
    """Return the policy name, or raise ValueError if it is unknown or only a baseline of the
    benchmarks (not ``offered`` to a market), naming what may be chosen."""
    name = policy_checked(policy)
    if not POLICY[name].offered:
        raise ValueError(
            f"policy {name!r} is a baseline of the benchmarks, not offered for a market; choose "
            f"one of {', '.join(OFFERED)}"
        )
    return name


def block_key(policy: str, bsum: float, n: int, work: int, cached: bool = False) -> float:
    """The key the DFS auction ``policy`` orders sibling blocks by, higher first (``BlockKey``);
    ``cached``: the block's edge is (partly) cached."""
    key = POLICY[policy_checked(policy)].block_key
    if key is None:
        raise ValueError(f"policy {policy!r} does not order blocks by a key")
    return key(bsum, n, work, cached)
