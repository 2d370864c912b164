"""Random waiting queues for the property tests: few distinct tokens, so prefixes are shared."""

from __future__ import annotations

from hypothesis import strategies as st

from mechanism import WaitingRequest
from mechanism.reference import Req

# Bids on a grid of quarters: sums and quotients are exact in floating point, so the mechanism
# and the reference agree on ties exactly.
BIDS = st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


@st.composite
def queues(draw, min_size: int = 1, max_size: int = 6, max_len: int = 5):
    n = draw(st.integers(min_size, max_size))
    reqs = []
    for i in range(n):
        toks = tuple(draw(st.lists(st.integers(0, 2), min_size=1, max_size=max_len)))
        reqs.append(
            Req(
                id=f"r{i}",
                tokens=toks,
                bid=draw(BIDS),
                arrival=float(draw(st.integers(0, 3))),
                cached_len=draw(st.integers(0, len(toks))),
            )
        )
    return reqs


def to_mechanism(reqs: list[Req]) -> list[WaitingRequest]:
    return [WaitingRequest(r.id, r.tokens, r.bid, r.arrival, r.cached_len) for r in reqs]
