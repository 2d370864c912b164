"""One auction round: order the waiting queue, plan completions, price priority (DESIGN.md 4)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from .payments import FlatCharges, dfs_charge, dfs_payments
from .policies import BID_POLICIES, DFS_AUCTIONS, PLANNERS, policy_checked
from .requests import BID_SCALE, WaitingRequest, to_ticks
from .tree import Entry, RequestTree

DEFAULT_TOKENS_PER_SECOND = 10_000.0


class Clearing:
    """The plan of one round: service order, planned completions (seconds), welfare, charges.

    Engines read the front of the order and price what they admit (``completion_at``,
    ``charge``); the rest is worked out only when asked for (``completion``, ``welfare``,
    ``payments``). A clearing is valid until its tree changes or clears another round; asking it
    for anything lazy afterwards raises RuntimeError.
    """

    def __init__(
        self,
        tree: RequestTree,
        policy: str,
        *,
        reserve: float,
        tokens_per_second: float,
        overhead_tokens: int,
        plan: tuple[list[Entry], list[int] | None],
    ) -> None:
        self.policy = policy
        self.reserve = reserve
        self.tokens_per_second = tokens_per_second
        self.overhead_tokens = overhead_tokens
        entries, cums = plan
        self._tree = tree
        self._version = tree.version
        self._reserve_ticks = to_ticks(reserve)
        # Amounts in bid ticks x tokens become dollars; tokens become seconds:
        self._dollars = 1.0 / (BID_SCALE * tokens_per_second)
        self._seconds = 1.0 / tokens_per_second
        self._entries = entries
        # Cumulative work at each completion: complete for DFS plans, extended on demand by a
        # marking walk for the others (each node's uncached tokens counted once).
        self._cums: list[int] = [] if cums is None else cums
        if cums is None:
            tree.stamp += 1
            self._stamp = tree.stamp
            tree.root.done = self._stamp
        self._order: list[str] | None = None
        self._flat: FlatCharges | None = None
        self._payments: dict[str, float] | None = None
        self._positions: dict[str, int] | None = None

    def _check(self) -> None:
        if self._tree.version != self._version:
            raise RuntimeError("the request tree changed since this round was cleared")

    def _cums_upto(self, k: int) -> list[int]:
        """The cumulative work of the first ``k`` requests of the order (tokens)."""
        cums = self._cums
        if len(cums) < k:
            self._check()
            stamp = self._stamp
            overhead = self.overhead_tokens
            cum = cums[-1] if cums else 0
            for e in self._entries[len(cums) : k]:
                x = e.node
                while x.done != stamp:
                    cum += x.ew
                    x.done = stamp
                    x = x.parent
                cum += overhead
                cums.append(cum)
        return cums

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def order(self) -> list[str]:
        """Request ids in service order."""
        if self._order is None:
            self._order = [e.req.id for e in self._entries]
        return self._order

    def completion_at(self, position: int) -> float:
        """Planned completion (seconds) of the request at ``position`` of the order."""
        return self._cums_upto(position + 1)[position] * self._seconds

    @property
    def completion(self) -> dict[str, float]:
        """Planned completion of every waiting request, seconds."""
        cums = self._cums_upto(len(self._entries))
        seconds = self._seconds
        return {rid: cum * seconds for rid, cum in zip(self.order, cums, strict=True)}

    @property
    def welfare(self) -> float:
        """-sum(effective bid x planned completion), dollars; bids under the reserve count 0."""
        cums = self._cums_upto(len(self._entries))
        reserve_ticks = self._reserve_ticks
        welfare = 0
        for e, cum in zip(self._entries, cums, strict=True):
            if e.ticks >= reserve_ticks:
                welfare -= e.ticks * cum
        return welfare * self._dollars

    def _charge_and_saving(self, request_id: str) -> tuple[float, int]:
        self._check()
        entry = self._tree.entries.get(request_id)
        if entry is None:
            raise ValueError(f"request {request_id!r} was not in this round")
        if self.policy not in BID_POLICIES:
            return 0.0, 0
        if self.policy in DFS_AUCTIONS:
            return dfs_charge(
                entry, density=self.policy == "dfs-auction-density", reserve=self._reserve_ticks
            )
        return self._flat_charges().charge_at(self._position(request_id))

    def _flat_charges(self) -> FlatCharges:
        if self._flat is None:
            self._flat = FlatCharges(self._entries, self._cums_upto, self._reserve_ticks)
        return self._flat

    def _position(self, request_id: str) -> int:
        if self._positions is None:
            self._positions = {rid: i for i, rid in enumerate(self.order)}
        return self._positions[request_id]

    def charge(self, request_id: str) -> float:
        """The request's priority charge in dollars if it is admitted in this round."""
        if self._payments is not None and request_id in self._payments:
            return self._payments[request_id]
        return self._charge_and_saving(request_id)[0] * self._dollars

    def time_saved(self, request_id: str) -> float:
        """Planned seconds the request saves by its bid over bidding 0: T_i(b) of DESIGN.md 4.4."""
        return self._charge_and_saving(request_id)[1] / self.tokens_per_second

    @property
    def payments(self) -> dict[str, float]:
        """Priority charge of every waiting request, dollars."""
        if self._payments is None:
            self._check()
            if self.policy not in BID_POLICIES:
                self._payments = dict.fromkeys(self.order, 0.0)
            else:
                if self.policy in DFS_AUCTIONS:
                    amounts, _ = dfs_payments(
                        self._tree.root,
                        self._entries,
                        density=self.policy == "dfs-auction-density",
                        reserve=self._reserve_ticks,
                    )
                else:
                    flat = self._flat_charges()
                    amounts = [flat.charge_at(p)[0] for p in range(len(self.order))]
                scale = self._dollars
                self._payments = {
                    rid: amount * scale for rid, amount in zip(self.order, amounts, strict=True)
                }
        return self._payments


def _params_checked(
    reserve: float, tokens_per_second: float, overhead_tokens: int
) -> tuple[float, float, int]:
    if isinstance(reserve, bool) or not isinstance(reserve, int | float):
        raise ValueError(f"reserve must be a number, got {reserve!r}")
    if not math.isfinite(reserve) or reserve < 0:
        raise ValueError(f"reserve must be finite and >= 0, got {reserve!r}")
    if isinstance(tokens_per_second, bool) or not isinstance(tokens_per_second, int | float):
        raise ValueError(f"tokens_per_second must be a number, got {tokens_per_second!r}")
    if not math.isfinite(tokens_per_second) or tokens_per_second <= 0:
        raise ValueError(f"tokens_per_second must be finite and > 0, got {tokens_per_second!r}")
    if isinstance(overhead_tokens, bool) or not isinstance(overhead_tokens, int):
        raise ValueError(f"overhead_tokens must be an int, got {overhead_tokens!r}")
    if overhead_tokens < 0:
        raise ValueError(f"overhead_tokens must be >= 0, got {overhead_tokens!r}")
    return float(reserve), float(tokens_per_second), overhead_tokens


def clear_tree(
    tree: RequestTree,
    policy: str,
    *,
    reserve: float = 0.0,
    tokens_per_second: float = DEFAULT_TOKENS_PER_SECOND,
    overhead_tokens: int = 0,
) -> Clearing:
    """Run one round on a maintained request tree."""
    policy = policy_checked(policy)
    reserve, tps, overhead = _params_checked(reserve, tokens_per_second, overhead_tokens)
    tree.version += 1  # the planners rewrite the nodes' per-round fields: older clearings expire
    plan = PLANNERS[policy](tree, policy, to_ticks(reserve), overhead)
    return Clearing(
        tree, policy, reserve=reserve, tokens_per_second=tps, overhead_tokens=overhead, plan=plan
    )


def clear(
    requests: Iterable[WaitingRequest],
    policy: str,
    *,
    reserve: float = 0.0,
    tokens_per_second: float = DEFAULT_TOKENS_PER_SECOND,
    overhead_tokens: int = 0,
) -> Clearing:
    """Run one round from scratch on a waiting queue: build the request tree, order, price."""
    policy = policy_checked(policy)
    return clear_tree(
        RequestTree(list(requests)),
        policy,
        reserve=reserve,
        tokens_per_second=tokens_per_second,
        overhead_tokens=overhead_tokens,
    )
