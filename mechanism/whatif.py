"""The reserve what-if: a recorded round's waiting queue, cleared again at other reserves.

A round record carries, with its book, a ``QueueSnapshot``: the round's request tree without
its tokens (each node's parent and edge length, each request's node, id, bid as sent, arrival,
cached length and tenant tag) and the settings it cleared with. ``queue_tree`` rebuilds a tree
of the same shape from it (each edge made of one made-up token, so siblings still part at their
first token), and ``queue_reclear`` clears that tree at each reserve of a list with the round's
policy. At the reserve the round cleared with, the tree, the order and the charges are the
round's own, so the charges of the places the round admitted are the ones it recorded.

What one reserve gives (``ReserveOutcome``):

- **revenue**: the priority charges of the requests at the places in the order the round admitted
  (the engine admits from the front; at another reserve other requests stand there), dollars;
- **welfare**: -sum(bid as sent x planned completion) over the whole queue, dollars. A bid under
  the reserve still counts at its value here: the reserve changes the order, not what waiting
  costs the bidder (``Clearing.planned_welfare`` counts it 0, and so would improve with every
  rise of the reserve);
- **priority**: the waiting requests whose bid buys priority (effective bid > 0).

It answers what the recorded queues would have paid at another reserve, bids unchanged: bidders
may well respond to a new reserve, so it is not a forecast. Age credits (aging.py) are kept as
the round had them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict, cast

from .clearing import CHARGE_SCOPES, clear_tree
from .policies import policy_checked
from .requests import WaitingRequest, bid_checked, effective_bid, to_ticks
from .tree import Node, RequestTree
from .welfare import planned_welfare

QUEUE_LIMIT = 2000  # waiting requests, at most, in a snapshot (a longer queue is left out)
GRID_QUANTILES = tuple(q / 10 for q in range(1, 10))  # of the waiting bids, for reserve_grid


class QueueSnapshot(TypedDict):
    """A round's waiting queue, enough to clear it again. Nodes are the request tree's without
    the root, parents before children; lists of one kind have one entry per node or request."""

    parent: list[int]  # per node: its parent's index, -1 for the root
    edge: list[int]  # per node: tokens of its edge (>= 1)
    node: list[int]  # per request: the node it ends at
    id: list[str]  # per request
    bid: list[float]  # per request, as sent, $/s
    arrival: list[float]  # per request, seconds of the engine's clock (ties: earliest first)
    cached: list[int]  # per request: leading tokens already in the KV cache
    owner: NotRequired[list[str]]  # per request, tenant tags; absent when none has one
    credit: NotRequired[list[int]]  # per request, age credit in bid ticks; absent when none has one
    # Per request, in the plan (docs/mechanism.md, "Requests, the request tree and work").
    overhead_tokens: int
    charge_scope: str  # clearing.CHARGE_SCOPES


@dataclass(frozen=True, slots=True)
class ReserveOutcome:
    """One recorded round cleared again at ``reserve`` ($/s). Dollars and counts."""

    reserve: float
    revenue: float  # priority charges of the admitted places
    welfare: float  # -sum(bid as sent x planned completion), the whole queue
    priority: int  # waiting requests whose bid buys priority
    waiting: int
    charged: tuple[tuple[str, float], ...]  # (request id, charge) at the admitted places


def queue_snapshot(tree: RequestTree, *, overhead_tokens: int, charge_scope: str) -> QueueSnapshot:
    """The snapshot of ``tree`` as a round cleared it (with ``overhead_tokens`` per request and
    ``charge_scope``: the round's ``Clearing``'s)."""
    index: dict[Node, int] = {tree.root: -1}
    parent: list[int] = []
    edge: list[int] = []
    for x in tree.nodes()[1:]:  # parents first
        assert x.parent is not None
        index[x] = len(parent)
        parent.append(index[x.parent])
        edge.append(x.end - x.start)
    entries = list(tree.entries.values())
    snapshot: QueueSnapshot = {
        "parent": parent,
        "edge": edge,
        "node": [index[e.node] for e in entries],
        "id": [e.req.id for e in entries],
        "bid": [e.req.bid for e in entries],
        "arrival": [e.req.arrival for e in entries],
        "cached": [e.req.cached_len for e in entries],
        "overhead_tokens": overhead_tokens,
        "charge_scope": charge_scope,
    }
    if any(e.req.owner for e in entries):
        snapshot["owner"] = [e.req.owner for e in entries]
    if any(e.credit for e in entries):
        snapshot["credit"] = [e.credit for e in entries]
    return snapshot


def _ints(obj: dict[str, Any], name: str, where: str, *, low: int) -> list[int]:
    values = obj.get(name)
    if not isinstance(values, list) or not all(type(v) is int and v >= low for v in values):
        raise ValueError(f"{where}: field {name!r} must be a list of integers >= {low}")
    return cast(list[int], values)


def _numbers(obj: dict[str, Any], name: str, where: str) -> list[float]:
    values = obj.get(name)
    if not isinstance(values, list) or not all(
        type(v) in (int, float) and math.isfinite(v) for v in values
    ):
        raise ValueError(f"{where}: field {name!r} must be a list of finite numbers")
    return cast(list[float], values)


def _strings(obj: dict[str, Any], name: str, where: str) -> list[str]:
    values = obj.get(name)
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{where}: field {name!r} must be a list of strings")
    return cast(list[str], values)


def _check_nodes(parent: list[int], edge: list[int], where: str) -> None:
    if len(edge) != len(parent):
        raise ValueError(f"{where}: fields 'parent' and 'edge' differ in length")
    for i, p in enumerate(parent):
        if not -1 <= p < i:
            raise ValueError(f"{where}: field 'parent' at node {i} is {p}, not an earlier node")


def _check_requests(obj: dict[str, Any], where: str) -> None:
    nodes = len(obj["parent"])
    n = len(obj["node"])
    optional = tuple(name for name in ("owner", "credit") if name in obj)
    for name in ("id", "bid", "arrival", "cached", *optional):
        if len(obj[name]) != n:
            raise ValueError(f"{where}: field {name!r} has {len(obj[name])} entries, not {n}")
    if any(k >= nodes for k in obj["node"]):
        raise ValueError(f"{where}: field 'node' names a node that is not in 'parent'")
    if len(set(obj["id"])) != n or not all(obj["id"]):
        raise ValueError(f"{where}: field 'id' must hold distinct non-empty ids")
    for rid, bid in zip(obj["id"], obj["bid"], strict=True):
        try:
            bid_checked(bid, request_id=rid)
        except ValueError as exc:
            raise ValueError(f"{where}: field 'bid': {exc}") from None
    depth: list[int] = []  # tokens from the root to the end of each node's edge
    for p, length in zip(obj["parent"], obj["edge"], strict=True):
        depth.append((depth[p] if p >= 0 else 0) + length)
    if any(c > depth[k] for k, c in zip(obj["node"], obj["cached"], strict=True)):
        raise ValueError(f"{where}: field 'cached' is longer than a request's prompt")
    # Every node holds a request or parts into two subtrees, as the tree keeps it compressed:
    # a tree of any other shape would not be rebuilt as it was.
    held = [0] * nodes
    for p in obj["parent"]:
        if p >= 0:
            held[p] += 1
    for k in obj["node"]:
        held[k] += 2
    if any(h < 2 for h in held):
        raise ValueError(f"{where}: field 'parent' has a node with no request and one child")


def queue_snapshot_checked(obj: Any, where: str = "queue") -> QueueSnapshot:
    """``obj`` as a QueueSnapshot, or ValueError naming the field that is wrong (``where``:
    what to call the snapshot in the message)."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object, got {type(obj).__name__}")
    parent = _ints(obj, "parent", where, low=-1)
    _check_nodes(parent, _ints(obj, "edge", where, low=1), where)
    _ints(obj, "node", where, low=0)
    _ints(obj, "cached", where, low=0)
    _strings(obj, "id", where)
    _numbers(obj, "bid", where)
    _numbers(obj, "arrival", where)
    if "owner" in obj:
        _strings(obj, "owner", where)
    if "credit" in obj:
        _ints(obj, "credit", where, low=0)
    overhead = obj.get("overhead_tokens")
    if type(overhead) is not int or overhead < 0:
        raise ValueError(f"{where}: field 'overhead_tokens' must be an integer >= 0")
    if obj.get("charge_scope") not in CHARGE_SCOPES:
        raise ValueError(f"{where}: field 'charge_scope' must be one of {', '.join(CHARGE_SCOPES)}")
    _check_requests(obj, where)
    return cast(QueueSnapshot, obj)


def queue_tree(queue: QueueSnapshot) -> RequestTree:
    """A request tree of the snapshot's shape: each node's edge is its index as a token, repeated
    (ValueError if a request's cached length is longer than its prompt)."""
    prefixes: list[tuple[int, ...]] = []
    for i, (p, length) in enumerate(zip(queue["parent"], queue["edge"], strict=True)):
        prefixes.append((prefixes[p] if p >= 0 else ()) + (i,) * length)
    owners = queue.get("owner") or [""] * len(queue["id"])
    tree = RequestTree(
        [
            WaitingRequest(rid, prefixes[k], bid, arrival, cached, owner=owner)
            for k, rid, bid, arrival, cached, owner in zip(
                queue["node"],
                queue["id"],
                queue["bid"],
                queue["arrival"],
                queue["cached"],
                owners,
                strict=True,
            )  # fmt: skip
        ]
    )
    for rid, credit in zip(queue["id"], queue.get("credit") or (), strict=False):
        if credit:
            tree.set_credit(rid, credit)
    return tree


def queue_reclear(
    queue: QueueSnapshot,
    *,
    policy: str,
    tokens_per_second: float,
    admitted: Sequence[int],
    reserves: Iterable[float],
) -> list[ReserveOutcome]:
    """Clear the snapshot's queue with ``policy`` at each of ``reserves`` ($/s); ``admitted``:
    the places in the order (0 first) the round admitted."""
    tree = queue_tree(queue)
    waiting = len(tree)
    if any(not 0 <= p < waiting for p in admitted):
        raise ValueError(f"admitted places must be in 0..{waiting - 1}, got {list(admitted)!r}")
    policy = policy_checked(policy)
    entries = list(tree.entries.values())
    out = []
    for reserve in reserves:
        clearing = clear_tree(
            tree,
            policy,
            reserve=reserve,
            tokens_per_second=tokens_per_second,
            overhead_tokens=queue["overhead_tokens"],
            charge_scope=queue["charge_scope"],
        )
        order = clearing.order
        charged = tuple((order[p], clearing.charge(order[p])) for p in admitted)
        completion = clearing.completion
        r = to_ticks(reserve)
        out.append(
            ReserveOutcome(
                reserve=float(reserve),
                revenue=sum(c for _, c in charged),
                welfare=planned_welfare((tree.get(rid).bid, t) for rid, t in completion.items()),
                priority=sum(1 for e in entries if effective_bid(e.ticks, r, 0) > 0),
                waiting=waiting,
                charged=charged,
            )
        )
    return out


def reserve_grid(bids: Sequence[float], *, current: float) -> list[float]:
    """Reserves to clear at ($/s, ascending): none, the ``current`` one, the ``GRID_QUANTILES``
    of the positive ``bids`` (each a reserve that a known share of them falls under) and the
    highest bid (above it, no bid buys priority)."""
    positive = sorted(b for b in bids if b > 0)
    grid = {0.0, float(current)}
    if positive:
        n = len(positive)
        grid.update(positive[min(n - 1, math.ceil(q * n) - 1)] for q in GRID_QUANTILES)
        grid.add(positive[-1])
    return sorted(grid)
