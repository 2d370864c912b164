"""What a bid buys: quotes read from the waits of a market's recent requests.

A request's wait under the auctions depends on the bids around it: a higher bid goes ahead of
more of the queue. So the waits of recent requests are grouped by bid: from the highest bid
down, neighbouring bid levels are joined until a group holds at least ``min_size`` requests
(the lowest bids join the last group when too few are left). A group says what a bid in its
range bought lately: its waits' quantiles.

- :func:`queue_scaled` brings the waits up to the queue of now: while a queue grows
  (overload), a request that joined a shorter queue waited less than one joining now will,
  so its wait is scaled by the requests waiting now over those waiting when it joined (never
  down: at a light load a wait is mostly fixed costs, a prefill step, which a shorter queue
  does not shorten).
- :func:`waits_for` is the distribution a bid buys: the quantiles of its group's waits.
- :func:`quote` is the bid needed now to be served within ``ttft_s`` with probability ``p``:
  walking the groups from the highest bid down, the last group whose confident ``p``-quantile,
  and that of every group above it, is within ``ttft_s``; the quote is that group's median bid
  (0 when it is the group of requests that bought no priority, which waited within the target
  too). None when even the highest bids waited longer, or when the history is too short to say.
- A group's **confident** ``p``-quantile is its quantile at ``p`` raised by ``CONFIDENCE_Z``
  standard errors of a share measured on its ``n`` waits, ``p + z sqrt(p (1 - p) / n)`` (at most
  1): a group of 20 has to show that 15 of its waits, not 10, were within the target before its
  bid is quoted for half the time. Each group's share is an estimate from a few dozen waits, and
  the walk takes the lowest bid whose estimate passed, so without the margin it takes the group
  that was lucky and the quote falls short of ``p`` (``benchmarks.quotes`` measures it).

Pure and Django-free: the market's selector reads the history from the ledger's requests
(time to first token, effective bid at the reserve now, the queue it joined), the gateway
scales it to the queue of the market's live book and serves the quote; ``benchmarks.quotes``
calls the same functions on the simulated engine's records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MIN_GROUP = 20  # requests in a group of neighbouring bids: fewer say too little of a quantile
CONFIDENCE_Z = 2.0  # standard errors a quoted group's share within the target must clear
# The history a quote reads: the requests served in the last WINDOW_S seconds, the newest
# HISTORY_MAX of them.
WINDOW_S = 600.0
HISTORY_MAX = 2000


@dataclass(frozen=True)
class Waited:
    """One recent request: its effective bid ($/s of waiting; 0 bought no priority), its
    time to first token (seconds) and the requests waiting in its engine's queue when it
    joined, itself included (a round record's ``queue_len``; None when not known)."""

    bid: float
    ttft_s: float
    queue_len: int | None = None


def queue_scaled(history: Iterable[Waited], *, waiting: float | None) -> list[Waited]:
    """``history`` with each wait scaled to a queue of ``waiting`` requests (per engine, as a
    round counts them: ``queue_len``'s measure), by ``max(1, waiting / queue_len)``: what the
    wait would be if the queue it joined had been as long as now (see the module). A request
    whose ``queue_len`` is not known, or every one when ``waiting`` is None, keeps its wait."""
    if waiting is not None and not (math.isfinite(waiting) and waiting >= 0):
        raise ValueError(f"waiting must be a count >= 0, got {waiting}")
    scaled = []
    for w in history:
        if waiting is None or not w.queue_len or waiting <= w.queue_len:
            scaled.append(w)
        else:
            scaled.append(Waited(w.bid, w.ttft_s * waiting / w.queue_len, w.queue_len))
    return scaled


@dataclass(frozen=True)
class BidGroup:
    """Requests whose bids were neighbours: their bids' range ($/s), median bid, and waits
    (seconds, ascending)."""

    low: float
    high: float
    median_bid: float
    waits: tuple[float, ...]

    def quantile(self, p: float) -> float:
        """The ``p``-quantile (0..1) of the waits: the smallest wait that at least a share
        ``p`` of them did not exceed (nearest rank)."""
        if not 0 < p <= 1:
            raise ValueError(f"p must be in (0, 1], got {p}")
        rank = max(1, math.ceil(p * len(self.waits) - 1e-9))
        return self.waits[rank - 1]

    def confident_quantile(self, p: float) -> float:
        """The quantile at ``p`` raised by ``CONFIDENCE_Z`` standard errors of a share measured
        on this group's waits (see the module): the wait a quote for ``p`` is judged by."""
        if not 0 < p <= 1:
            raise ValueError(f"p must be in (0, 1], got {p}")
        margin = CONFIDENCE_Z * math.sqrt(p * (1 - p) / len(self.waits))
        return self.quantile(min(1.0, p + margin))


def bid_groups(history: Iterable[Waited], *, min_size: int = MIN_GROUP) -> list[BidGroup]:
    """The history's groups of neighbouring bids, highest bids first (see the module)."""
    by_bid = sorted(history, key=lambda w: w.bid, reverse=True)
    if len(by_bid) < min_size:
        return []
    groups: list[list[Waited]] = []
    current: list[Waited] = []
    for i, waited in enumerate(by_bid):
        current.append(waited)
        level_ends = i + 1 == len(by_bid) or by_bid[i + 1].bid != waited.bid
        if level_ends and len(current) >= min_size:
            groups.append(current)
            current = []
    if current:  # the lowest bids, too few for a group of their own
        groups[-1].extend(current)
    return [_group(members) for members in groups]


def _group(members: Sequence[Waited]) -> BidGroup:
    bids = sorted(w.bid for w in members)
    return BidGroup(
        low=bids[0],
        high=bids[-1],
        median_bid=bids[(len(bids) - 1) // 2],
        waits=tuple(sorted(w.ttft_s for w in members)),
    )


def quote(groups: Sequence[BidGroup], *, ttft_s: float, p: float) -> float | None:
    """The bid ($/s) needed to be served within ``ttft_s`` seconds with probability ``p``, from
    ``groups`` (highest bids first); None when no bid was seen to buy that (see the module)."""
    if not ttft_s > 0:
        raise ValueError(f"ttft_s must be > 0, got {ttft_s}")
    found: BidGroup | None = None
    for group in groups:
        if group.confident_quantile(p) > ttft_s:
            break
        found = group
    if found is None:
        return None
    return 0.0 if found.low == 0 else found.median_bid


def waits_for(groups: Sequence[BidGroup], bid: float) -> BidGroup | None:
    """The group whose bids ``bid`` is among (the nearest one when it falls between or outside
    them); None without groups."""
    if not groups:
        return None
    return min(groups, key=lambda g: 0.0 if g.low <= bid <= g.high else min(
        abs(bid - g.low), abs(bid - g.high)
    ))  # fmt: skip
