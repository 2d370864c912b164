"""The automatic wait bound: each market's bound set from its own recent waits.

The bound (``aging.py``) must sit on the market's own time scale. Far above every wait it does
nothing. Below most waits every old request holds the full credit, and since the credit is the
same per prompt token for everyone, the order is by bid density again: no bound at all (and
worse, docs/benchmarks.md, "Bounded waiting"). So an operator who leaves it alone gets

    target = MULTIPLE x the mean time to first token of the last WINDOW served requests,
             within AUTO_MIN_S..AUTO_MAX_S
    bound' = the bound, while the target is within DEADBAND of it; else
             the target, when it is above (at once), or
             the bound less FALL, at most down to the target, when it is below;
             to 2 significant digits

renewed every interval (the market's periodic step, or the benchmark's on its virtual clock),
starting at PRIOR_S until MIN_SAMPLES requests have been served.

Why the mean: a work-conserving queue's order moves who waits, hardly how much waiting there is
in all, so the mean wait is nearly the same under every order (on the KV sweep the auction's
mean TTFT is within a few percent of lpm's at every point, with the bound or without), and the
rule reads a figure its own bound barely moves. A high quantile would chase itself: the bound
cuts the tail the quantile measures, the next bound is shorter, and so on down to where every
old request holds the full credit. Why MULTIPLE mean waits: the tail to be bounded is a few mean
waits long (lpm's p99 TTFT is 2 to 3.6 x its mean across the KV sweep), the served mean lags a
queue that is building, and a bound a little long costs less than one a little short; of the
multiples 4 to 10 run on the whole KV sweep (``python -m benchmarks.wait_multiples``), 8 met the
goal at the most points. Why up at once and down slowly: a bound too short undoes the auction
(above), one too long only bounds less, and the served waits lag the queue (a request is counted
when it is served, so while a queue builds the recent waits understate the waits to come); so
the bound follows a rise at the next renewal and a fall by an eighth a renewal, the automatic
reserve's step. Why a dead band and 2 digits: every move is audited and pushed to the engines,
so the bound moves when the waits have really moved.

What a waiting request's credit makes of its bid, for the quotes and the book: ``ranks_as``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from .aging import WAIT_BOUND_MAX_S, WAIT_BOUND_MIN_S, AgeCredit
from .requests import BID_SCALE, to_ticks

MULTIPLE = 8.0  # the bound, in mean waits (chosen on the KV sweep: docs/benchmarks.md)
WINDOW = 512  # the served requests the mean is taken over, newest first
MIN_SAMPLES = 32  # fewer served than this: no evidence, the bound stays
PRIOR_S = 20.0  # seconds: a new market's bound (a fixed 20 s held the tail on production traces)
AUTO_MIN_S = 2.0  # seconds: shorter bounds saturate the credit on a burst
AUTO_MAX_S = 600.0  # seconds: past ten minutes the bound bounds nothing a client waits for
DEADBAND = 0.25  # a target within 25% of the bound leaves it where it is
FALL = 1 / 8  # the most the bound falls in one renewal (the automatic reserve's step)

# What "auto" does, in the console's words.
AUTO_HELP = (
    f"toward {MULTIPLE:g} x the mean time to first token of the last {WINDOW} requests served, "
    f"up at once, down by at most {FALL:.1%} a renewal, left alone within {DEADBAND:.0%}, "
    f"{AUTO_MIN_S:g}-{AUTO_MAX_S:g} s"
)

# The three ways a market's bound is set (the console's choice).
AUTO, PINNED, OFF = "auto", "pinned", "off"
MODES = (AUTO, PINNED, OFF)

assert WAIT_BOUND_MIN_S <= AUTO_MIN_S <= PRIOR_S <= AUTO_MAX_S <= WAIT_BOUND_MAX_S


def wait_bound_target(waits: Iterable[float], *, multiple: float = MULTIPLE) -> float | None:
    """``multiple`` x the mean of ``waits`` (times to first token, seconds; the newest
    ``WINDOW`` are read), within ``AUTO_MIN_S..AUTO_MAX_S``; None under ``MIN_SAMPLES``."""
    recent = [w for w in waits if math.isfinite(w) and w >= 0][:WINDOW]
    if len(recent) < MIN_SAMPLES:
        return None
    return min(AUTO_MAX_S, max(AUTO_MIN_S, multiple * math.fsum(recent) / len(recent)))


def significant(value: float, digits: int = 2) -> float:
    """``value`` (> 0) rounded to ``digits`` significant digits: 23.456 -> 23, 4.567 -> 4.6."""
    return round(value, digits - 1 - math.floor(math.log10(value)))


def wait_bound_renewed(
    bound_s: float, waits: Iterable[float], *, multiple: float = MULTIPLE
) -> float:
    """The automatic bound (seconds) after one interval, from the bound in force ``bound_s``
    and the recent ``waits`` (times to first token of served requests, newest first)."""
    if not bound_s > 0:
        raise ValueError(f"the bound in force must be > 0 seconds, got {bound_s!r}")
    target = wait_bound_target(waits, multiple=multiple)
    if target is None or bound_s / (1 + DEADBAND) <= target <= bound_s * (1 + DEADBAND):
        return bound_s
    moved = target if target > bound_s else max(target, bound_s * (1 - FALL))
    return min(AUTO_MAX_S, max(AUTO_MIN_S, significant(moved)))


def ranks_as(bid: float, *, prompt_tokens: int, waited_s: float, credit: AgeCredit) -> float:
    """The bid ($/s) a request of ``prompt_tokens`` that bid ``bid`` ranks as under the DFS
    auctions once it has waited ``waited_s`` seconds: its bid plus the credit it has earned
    (``aging.AgeCredit``, in whole bid ticks as the tree gives it). Its charge is still on its
    bid alone: a credit is never paid."""
    level = credit.level(0.0, waited_s)
    return (to_ticks(bid) + credit.credit_ticks(level, prompt_tokens)) / BID_SCALE
