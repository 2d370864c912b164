"""One auction round: order the waiting queue, plan completions, price priority (the rules:
docs/mechanism.md)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import compress, count
from operator import attrgetter

from .payments import Charges, DfsCharges, TenantCharges
from .plan import BSUM, REQUESTS, WORK, Plan
from .policies import POLICY, policy_checked
from .requests import BID_SCALE, WaitingRequest, effective_bid, number_checked, to_ticks
from .tree import Node, RequestTree
from .welfare import planned_welfare

DEFAULT_TOKENS_PER_SECOND = 10_000.0
_handle = attrgetter("handle")
_SEARCHED = 8  # up to this many requests, ``positions`` searches the order once for each
REQUEST_SCOPE = "request"  # a request pays for the delay it imposes on every other request
TENANT_SCOPE = "tenant"  # ... on other tenants' requests only
CHARGE_SCOPES = (REQUEST_SCOPE, TENANT_SCOPE)


class Clearing:
    """The plan of one round: service order, planned completions (seconds), planned welfare,
    priority charges.

    Engines read the front of the order and price what they admit (``completion_at``,
    ``charge``); the rest is worked out only when asked for (``completion``, ``planned_welfare``,
    ``payments``). The round's scratch is its own (the ``Plan`` and the nodes its on-demand work
    has counted), never the tree's: a clearing is valid until its tree changes, however many
    other rounds are cleared on the tree meanwhile; asking it for anything lazy after a change
    raises RuntimeError.
    """

    def __init__(
        self,
        tree: RequestTree,
        policy: str,
        *,
        reserve: float,
        tokens_per_second: float,
        overhead_tokens: int,
        plan: Plan,
        charge_scope: str = REQUEST_SCOPE,
    ) -> None:
        self.policy = policy
        self.charge_scope = charge_scope
        self._rules = POLICY[policy]
        self.reserve = reserve
        self.tokens_per_second = tokens_per_second
        self.overhead_tokens = overhead_tokens
        self._plan = plan
        self._tree = tree
        self._version = tree.version
        self._reserve_ticks = to_ticks(reserve)
        # Amounts in bid ticks x tokens become dollars; tokens become seconds:
        self._dollars = 1.0 / (BID_SCALE * tokens_per_second)
        self._seconds = 1.0 / tokens_per_second
        # The order, which the DFS planner refills in its next round once the tree changed:
        # read only after ``_check``.
        self._entries = plan.order
        self._size = len(plan.order)
        # Cumulative work at each completion, extended on demand by a marking walk (each node's
        # uncached tokens counted once, on the way to the first request that needs it, which in
        # a DFS order is where the order enters the node): ``_counted`` holds the shared nodes
        # counted so far, the root (no edge) from the start.
        self._cums: list[int] = [] if plan.cums is None else plan.cums
        self._counted: set[Node] = {tree.root}
        self._order: list[str] | None = None
        self._charges: Charges | None = None
        self._payments: dict[str, float] | None = None
        self._priced: dict[str, tuple[float, int]] = {}

    def _check(self) -> None:
        if self._tree.version != self._version:
            raise RuntimeError("the request tree changed since this round was cleared")

    def _cums_upto(self, k: int) -> list[int]:
        """The cumulative work of the first ``k`` requests of the order (tokens)."""
        cums = self._cums
        if len(cums) < k:
            self._check()
            counted = self._counted
            overhead = self.overhead_tokens
            cum = cums[-1] if cums else 0
            x: Node | None
            for e in self._entries[len(cums) : k]:
                x = e.node
                if x.size == 1:
                    # A leaf holding only this request, the common case: no other request needs
                    # it, so it is counted without being filed (the set stays small and fast).
                    cum += x.ew
                    x = x.parent
                while x not in counted:
                    # Once per node: the root is counted, so the walk stops below its parent.
                    assert x is not None
                    cum += x.ew
                    counted.add(x)
                    x = x.parent
                cum += overhead
                cums.append(cum)
        return cums

    def __len__(self) -> int:
        return self._size

    @property
    def order(self) -> list[str]:
        """Request ids in service order (a list of all of them, made on first use)."""
        if self._order is None:
            self._check()
            self._order = [e.req.id for e in self._entries]
        return self._order

    def iter_order(self) -> Iterator[str]:
        """Request ids in service order, one at a time: for engines that admit from the front
        and stop (no list of the whole queue made); read it before the next round on the
        changed tree, which refills the order."""
        self._check()
        return (e.req.id for e in self._entries)

    def handles(self) -> list[object]:
        """The engine's handles on the requests (``RequestTree.insert``), in service order: a
        list the round may share with the planner's state, which a later round on the changed
        tree refills; do not modify it."""
        self._check()
        handles = self._plan.handles
        return list(map(_handle, self._entries)) if handles is None else handles

    def positions(self, request_ids: Iterable[str]) -> dict[str, int]:
        """The position in the order of each of ``request_ids``, scanning from the front only
        as far as the last of them (ValueError naming one that is not in the round)."""
        self._check()
        want = set(request_ids)
        found: dict[str, int] = {}
        if len(want) <= _SEARCHED:
            # A few: the list's own search for each entry (by identity, at C speed: several
            # times faster a request than the scan below, which tests every entry up to the last).
            entries = self._tree.entries
            for rid in sorted(want):
                entry = entries.get(rid)
                if entry is None:  # the order holds every request of the tree, and only those
                    raise ValueError(f"request {rid!r} was not in this round")
                found[rid] = self._entries.index(entry)
            return found
        # Many (a round's arrivals, anywhere in the order): their entries looked up, then one
        # scan of the order that tests each entry at C speed (entries hash by identity; no id
        # read) and reads only the hits. The order holds every request of the tree, and only
        # those, so a request not in the tree is the one not in the round.
        entries = self._tree.entries
        missing = sorted(rid for rid in want if rid not in entries)
        if missing:
            raise ValueError(f"request {missing[0]!r} was not in this round")
        wanted = {entries[rid] for rid in want}
        order = self._entries
        for i in compress(count(), map(wanted.__contains__, order)):
            found[order[i].req.id] = i
            if len(found) == len(want):
                break
        return found

    def block_totals(self, node: Node) -> tuple[int, int, int] | None:
        """A subtree's requests, effective bids (ticks) and work (tokens) as the round's DFS plan
        has them, or None when the plan keeps none (bid-blind orders, highest-bid)."""
        self._check()
        blocks = self._plan.blocks
        if blocks is None:
            return None
        if node.size == 1:
            return None  # a leaf's block is its request's, kept by its parent
        block = blocks[node]
        return block[REQUESTS], block[BSUM], block[WORK]

    def completion_at(self, position: int) -> float:
        """Planned completion (seconds) of the request at ``position`` of the order."""
        return self._cums_upto(position + 1)[position] * self._seconds

    @property
    def completion(self) -> dict[str, float]:
        """Planned completion of every waiting request, seconds."""
        self._check()
        cums = self._cums_upto(self._size)
        seconds = self._seconds
        return {rid: cum * seconds for rid, cum in zip(self.order, cums, strict=True)}

    @property
    def planned_welfare(self) -> float:
        """Planned welfare of the order (welfare.py), dollars; bids under the reserve count 0.

        Summed exactly, in bid ticks x tokens, then converted to dollars.
        """
        self._check()
        cums = self._cums_upto(self._size)
        r = self._reserve_ticks
        ticks_tokens = planned_welfare(
            (effective_bid(e.ticks, r, 0), cum) for e, cum in zip(self._entries, cums, strict=True)
        )
        return ticks_tokens * self._dollars

    def _charge_rule(self) -> Charges | None:
        """The round's priority charges, by the policy's charge rule; None: nobody pays."""
        rule = self._rules.charges
        if rule is None:
            return None
        if self._charges is None:
            if self.charge_scope == TENANT_SCOPE and rule is DfsCharges:
                rule = TenantCharges
            self._charges = rule(self._plan, self._cums_upto, self._reserve_ticks)
        return self._charges

    def _charge_and_saving(self, request_id: str) -> tuple[float, int]:
        self._check()
        got = self._priced.get(request_id)
        if got is not None:
            return got
        entry = self._tree.entries.get(request_id)
        if entry is None:
            raise ValueError(f"request {request_id!r} was not in this round")
        charges = self._charge_rule()
        got = (0.0, 0) if charges is None else charges.charge(entry)
        self._priced[request_id] = got  # charge and time_saved ask for the same
        return got

    def charge(self, request_id: str) -> float:
        """The request's priority charge in dollars if it is admitted in this round."""
        if self._payments is not None and request_id in self._payments:
            return self._payments[request_id]
        return self._charge_and_saving(request_id)[0] * self._dollars

    def time_saved(self, request_id: str) -> float:
        """Planned seconds the request saves by its bid over bidding 0: T_i(b) of docs/mechanism.md,
        "Payments"."""
        return self._charge_and_saving(request_id)[1] / self.tokens_per_second

    @property
    def payments(self) -> dict[str, float]:
        """Priority charge of every waiting request, dollars."""
        if self._payments is None:
            self._check()
            charges = self._charge_rule()
            if charges is None:
                self._payments = dict.fromkeys(self.order, 0.0)
            else:
                amounts = charges.every()
                scale = self._dollars
                self._payments = {
                    rid: amount * scale for rid, amount in zip(self.order, amounts, strict=True)
                }
        return self._payments


def charge_scope_checked(scope: object) -> str:
    """``scope`` if it names a charge scope (CHARGE_SCOPES), else ValueError."""
    if scope not in CHARGE_SCOPES:
        raise ValueError(f"charge scope must be one of {', '.join(CHARGE_SCOPES)}, got {scope!r}")
    return scope


def clear_tree(
    tree: RequestTree,
    policy: str,
    *,
    reserve: float = 0.0,
    tokens_per_second: float = DEFAULT_TOKENS_PER_SECOND,
    overhead_tokens: int = 0,
    charge_scope: str = REQUEST_SCOPE,
) -> Clearing:
    """Run one round on a maintained request tree.

    ``charge_scope``: ``"request"`` (each request pays for the delay it imposes on every other
    request) or ``"tenant"`` (not for its own tenant's, ``payments.TenantCharges``; DFS
    auctions only, the other policies charge as usual)."""
    rules = POLICY[policy_checked(policy)]
    reserve = number_checked("reserve", reserve, allow_zero=True)
    tps = number_checked("tokens_per_second", tokens_per_second)
    overhead = overhead_tokens
    if isinstance(overhead, bool) or not isinstance(overhead, int) or overhead < 0:
        raise ValueError(f"overhead_tokens must be an int >= 0, got {overhead!r}")
    plan = rules.planner(tree, rules, to_ticks(reserve), overhead)
    return Clearing(
        tree,
        policy,
        reserve=reserve,
        tokens_per_second=tps,
        overhead_tokens=overhead,
        plan=plan,
        charge_scope=charge_scope_checked(charge_scope),
    )


def clear(
    requests: Iterable[WaitingRequest],
    policy: str,
    *,
    reserve: float = 0.0,
    tokens_per_second: float = DEFAULT_TOKENS_PER_SECOND,
    overhead_tokens: int = 0,
    charge_scope: str = REQUEST_SCOPE,
) -> Clearing:
    """Run one round from scratch on a waiting queue: build the request tree, order, price."""
    policy = policy_checked(policy)
    return clear_tree(
        RequestTree(list(requests)),
        policy,
        reserve=reserve,
        tokens_per_second=tokens_per_second,
        overhead_tokens=overhead_tokens,
        charge_scope=charge_scope,
    )
