"""The waiting request: what the mechanism knows about one request in the queue.

Units: ``bid`` is dollars per second of waiting, ``arrival`` is seconds (any epoch, only the order
matters), ``tokens`` are prompt token ids and ``cached_len`` is how many leading tokens are already
in the engine's KV cache. Tokens are kept as a tuple, or as given when they are an
``array("q")`` (SGLang's own type: no Python int per token, and slices compare in C).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeVar, overload

# Bids are compared in whole ticks of 1e-9 dollars per second, so that sums of bids, and the
# differences the payments take of them, are exact: a tie is a tie however the sum was formed.
BID_SCALE = 10**9
MAX_BID = 1e6  # dollars per second; anything above is a mistake, not a bid

# A bid in any of its representations: float dollars per second (the engines), whole ticks
# (the planners), exact Decimal dollars per second (the ledger's side).
Bid = TypeVar("Bid", int, float, Decimal)


@dataclass(frozen=True, slots=True)
class WaitingRequest:
    """One request in the waiting queue. Validated on construction: bad input raises ValueError."""

    id: str
    tokens: Sequence[int]
    bid: float
    arrival: float
    cached_len: int = 0
    # The tenant it belongs to, for tenant-level charges (clearing's charge_scope): "" for none,
    # which counts the request as a tenant of its own.
    owner: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"request id must be a non-empty string, got {self.id!r}")
        tokens = self.tokens
        if type(tokens) is not tuple and not (type(tokens) is array and tokens.typecode == "q"):
            object.__setattr__(self, "tokens", tuple(tokens))
        if not self.tokens:
            raise ValueError(f"request {self.id!r}: empty token list")
        object.__setattr__(self, "bid", bid_checked(self.bid, request_id=self.id))
        if isinstance(self.arrival, bool) or not isinstance(self.arrival, int | float):
            raise ValueError(f"request {self.id!r}: arrival must be a number, got {self.arrival!r}")
        if not math.isfinite(self.arrival):
            raise ValueError(f"request {self.id!r}: arrival must be finite, got {self.arrival!r}")
        cached = self.cached_len
        if isinstance(cached, bool) or not isinstance(cached, int):
            raise ValueError(f"request {self.id!r}: cached_len must be an int, got {cached!r}")
        if not isinstance(self.owner, str):
            raise ValueError(f"request {self.id!r}: owner must be a string, got {self.owner!r}")
        if not 0 <= cached <= len(self.tokens):
            raise ValueError(
                f"request {self.id!r}: cached_len {cached} outside 0..{len(self.tokens)}"
            )

    def with_cached_len(self, cached_len: int) -> WaitingRequest:
        """The same request with another cached length (checked as on construction), made
        without the dataclass machinery: the engines call it for every change the KV cache
        makes to a waiting request."""
        if isinstance(cached_len, bool) or not isinstance(cached_len, int):
            raise ValueError(f"request {self.id!r}: cached_len must be an int, got {cached_len!r}")
        if not 0 <= cached_len <= len(self.tokens):
            raise ValueError(
                f"request {self.id!r}: cached_len {cached_len} outside 0..{len(self.tokens)}"
            )
        new = object.__new__(WaitingRequest)
        put = object.__setattr__
        put(new, "id", self.id)
        put(new, "tokens", self.tokens)
        put(new, "bid", self.bid)
        put(new, "arrival", self.arrival)
        put(new, "cached_len", cached_len)
        put(new, "owner", self.owner)
        return new

    @property
    def tie(self) -> tuple[float, str]:
        """Tie-breaking key: earliest arrival first, then the smallest id."""
        return (self.arrival, self.id)


def bid_checked(bid: object, *, request_id: str) -> float:
    """Return ``bid`` as a float, or raise ValueError naming the request if it is not a valid bid.

    A valid bid is a finite, non-negative real number (dollars per second of waiting).
    """
    if isinstance(bid, bool) or not isinstance(bid, int | float):
        raise ValueError(f"request {request_id!r}: bid must be a number, got {bid!r}")
    value = float(bid)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"request {request_id!r}: bid must be finite, got {bid!r}")
    if value < 0:
        raise ValueError(f"request {request_id!r}: bid must be >= 0, got {bid!r}")
    if value > MAX_BID:
        raise ValueError(f"request {request_id!r}: bid {bid!r} is above the maximum {MAX_BID:g}")
    return value


def number_checked(name: str, value: float, *, allow_zero: bool = False) -> float:
    """``value`` as a float if it is a finite number > 0 (>= 0 with ``allow_zero``), else
    ValueError naming it ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>=' if allow_zero else '>'} 0, got {value!r}")
    return float(value)


def to_ticks(amount: float) -> int:
    """Dollars per second as a whole number of bid ticks (rounded to the nearest)."""
    return round(amount * BID_SCALE)


@overload
def effective_bid(bid: float, reserve: float) -> float: ...
@overload
def effective_bid(bid: Bid, reserve: Bid, zero: Bid) -> Bid: ...
def effective_bid(bid: Bid, reserve: Bid, zero: Bid | float = 0.0) -> Bid | float:
    """The bid that buys priority (docs/mechanism.md, "Payments"): ``bid`` itself when it is at
    least the reserve, else nothing, returned as ``zero`` (0.0 for float bids; pass 0 for ticks, the
    ledger's zero for Decimal amounts) so that each caller keeps its own representation exactly.

    ``zero`` may also go by position, as the planner and the charges pass it: they call this
    once per request of a round, where a keyword argument costs more than the rule."""
    return bid if bid >= reserve else zero
