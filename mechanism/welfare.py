"""The two welfares of docs/mechanism.md, "Welfare", defined once.

Welfare is a loss: minus what the waiting costs the bidders, in dollars (bids are dollars per
second of waiting, times are seconds). Closer to zero is better.

- **Planned welfare** of a round's order: -sum(effective bid x planned completion). The effective
  bid counts a bid under the reserve as 0; planned completions come from the work model of
  docs/mechanism.md, "Requests, the request tree and work". It is what the DFS auctions optimize
  (``Clearing.planned_welfare``), and what the market's pages and live feed show (the ``welfare`` of
  round results and revenue per minute).
- **Realized welfare** of what an engine served: -sum(bid x measured time to first token). It is
  what the benchmarks report (the ``welfare`` of their metrics).

Both take (bid, seconds) pairs, the bid already effective where the definition says so. The
reserve what-if (whatif.py) passes the bids as sent: what a reserve changes there is the order,
not what waiting costs a bidder.
"""

from __future__ import annotations

from collections.abc import Iterable


def planned_welfare(effective_bids_and_completions: Iterable[tuple[float, float]]) -> float:
    """-sum(effective bid x planned completion) over (effective bid, planned completion) pairs."""
    return -sum(b * c for b, c in effective_bids_and_completions)


def realized_welfare(bids_and_ttfts: Iterable[tuple[float, float]]) -> float:
    """-sum(bid x measured time to first token) over (bid, TTFT) pairs of served requests."""
    return -sum(b * t for b, t in bids_and_ttfts)
