"""The automatic reserve: a market's reserve walks toward a target wait, as EIP-1559's base fee
walks toward a target gas use.

The operator sets a target ``T`` (seconds): "requests whose bids buy priority see a time to first
token of at most ``T`` at the ``WAIT_QUANTILE``". Every interval the market measures that wait,
``w``, over its requests finished in the interval whose bids bought priority under the reserve in
force (``effective_bid`` > 0: at least the reserve, and not 0, since a zero bid buys nothing
whatever the reserve), and moves the reserve ``r`` by

    r' = r x (1 + STEP x clamp((w - T) / T, -1, 1))

A wait above the target means too many bids buy priority: the reserve rises, by at most
``STEP`` (1/8, 12.5%, EIP-1559's ``BASE_FEE_MAX_CHANGE_DENOMINATOR`` of 8) a step; a wait below
it, the reserve falls by at most as much. Where no request bought priority in the interval, the
wait is taken as 0 if the market served requests at all (priority demand is under the target:
one full step down), and the reserve stays where it is if it served nothing (no evidence).

A multiplicative rule cannot leave 0 nor reach it: a rise goes to at least ``tick`` (the smallest
reserve it sets), and a fall below ``tick`` goes to 0 (no reserve), so the reserve can be switched
off by the demand it follows. It never exceeds ``ceiling`` (the market's ``reserve_max``).
Floats here; the market quantizes the result to its money precision (``accounts.money.money``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .pacing import high_quantile
from .requests import effective_bid

STEP = 1 / 8  # the largest relative move in one interval (EIP-1559's 1/8)
WAIT_QUANTILE = 0.9  # the wait measured: the 90th percentile (nearest rank)
TICK = 1e-6  # $/s: where a rise from no reserve starts, and below which a fall ends at 0


@dataclass(frozen=True)
class Finished:
    """A request finished in the interval: its bid ($/s, as sent) and its time to first token
    (seconds)."""

    bid: float
    ttft_s: float


@dataclass(frozen=True)
class ReserveStep:
    """One interval's step: the reserve it sets ($/s), the wait it measured (seconds; None when
    no request bought priority), and how many requests it saw (``priority`` of ``served``)."""

    reserve: float
    wait_s: float | None
    priority: int
    served: int


def priority_wait_s(finished: Iterable[Finished], *, reserve: float) -> tuple[float | None, int]:
    """The ``WAIT_QUANTILE`` of the times to first token of the requests whose bids bought
    priority under ``reserve`` (seconds; None when there were none), and how many there were."""
    waits = [f.ttft_s for f in finished if effective_bid(f.bid, reserve) > 0]
    return (high_quantile(waits, WAIT_QUANTILE) if waits else None), len(waits)


def reserve_moved(
    reserve: float, *, wait_s: float | None, target_s: float, served: bool, ceiling: float,
    tick: float = TICK,
) -> float:  # fmt: skip
    """The reserve ($/s) after one interval that measured ``wait_s`` (None: no priority request
    finished; ``served``: whether any request finished at all) against ``target_s``."""
    if not target_s > 0:
        raise ValueError(f"the target wait must be > 0 seconds, got {target_s!r}")
    if not (reserve >= 0 and ceiling >= 0):
        raise ValueError(f"reserve and ceiling must be >= 0 $/s, got {reserve!r}, {ceiling!r}")
    if wait_s is None:
        if not served:
            return min(reserve, ceiling)
        wait_s = 0.0
    pressure = max(-1.0, min(1.0, (wait_s - target_s) / target_s))
    moved = reserve * (1 + STEP * pressure)
    if pressure > 0:
        moved = max(moved, tick)
    elif pressure < 0 and moved < tick:
        moved = 0.0
    return min(moved, ceiling)


def reserve_step(
    reserve: float, finished: Iterable[Finished], *, target_s: float, ceiling: float,
    tick: float = TICK,
) -> ReserveStep:  # fmt: skip
    """One interval of the automatic reserve: measure the priority wait of ``finished`` (the
    requests finished in the interval) under ``reserve`` and move it toward ``target_s``."""
    done = list(finished)
    wait_s, priority = priority_wait_s(done, reserve=reserve)
    moved = reserve_moved(
        reserve, wait_s=wait_s, target_s=target_s, served=bool(done), ceiling=ceiling, tick=tick
    )
    return ReserveStep(reserve=moved, wait_s=wait_s, priority=priority, served=len(done))
