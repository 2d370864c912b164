"""The reserve what-if of the console: the waiting queues of a market's recent rounds, cleared
again at a range of reserves (``mechanism.whatif``).

Keeping: round records carry their waiting queue with the book (at most every
``book_interval_s`` of an engine, 0.5 s by default). The publisher hands every record here;
per market, one queue every ``KEEP_INTERVAL_S`` is kept (``cache.add`` is the gate, so it is one
across processes and replicas), under its own key of Django's cache for ``WINDOW_S``, with an
index of (time, key) trimmed by time and by ``KEPT_MAX``: at most 360 queues a market, whatever
the traffic. No database table: the samples live in the cache and expire with the window.

Working out: ``whatif_for_market`` clears at most ``SAMPLE`` of the window's queues (evenly
spaced in time; as many as ``BUDGET_S`` allows) at each reserve of
``mechanism.whatif.reserve_grid`` (none, the current one, the quantiles of their bids), each with
its round's policy and plan rate, and averages per round; an answer with points is cached
``CACHE_S``. At the reserve a round cleared with, its charges are the ones it recorded, so the
revenue at the current reserve is the recorded one when the reserve did not move in the window
(``recorded``). Bidders may respond to a new reserve: this is
what the recorded queues would have paid, not a forecast.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, TypedDict

from django.core.cache import cache

from engines.contract.records import RoundRecord
from market.live.book import cache_lock
from mechanism import to_ticks
from mechanism.whatif import QueueSnapshot, queue_reclear, reserve_grid

logger = logging.getLogger(__name__)

KEEP_INTERVAL_S = 10.0  # one queue kept per market this often, at most
WINDOW_S = 3600.0  # the what-if's window: the last hour
KEPT_MAX = 400  # queues kept per market, at most (WINDOW_S / KEEP_INTERVAL_S is 360)
SAMPLE = 24  # queues cleared again per what-if, at most
# Seconds of work per what-if, about: past it, the rounds not yet cleared again are left out
# (about 40 ms a round of 500 waiting requests at 12 reserves; a queue of 2,000: 250 ms).
BUDGET_S = 1.5
CACHE_S = 10.0  # a what-if is worked out again at most this often per market and reserve


class KeptRound(TypedDict):
    """A recorded round, as the what-if keeps it."""

    at: float  # Unix seconds (wall) it was kept
    round_id: str
    policy: str
    reserve: float  # $/s, the round's
    tokens_per_second: float  # the plan's rate
    admitted: list[int]  # places in the round's order it admitted
    charges: list[float]  # what they were charged, dollars (recorded)
    queue: QueueSnapshot


class WhatIfPoint(TypedDict):
    """The sampled rounds cleared again at one reserve: means per round."""

    reserve: float  # $/s
    revenue: float  # priority charges of the admitted places, dollars per round
    welfare: float  # -sum(bid as sent x planned completion), dollars per round
    priority_share: float  # of the waiting requests, those whose bid buys priority (0..1)


class ReserveWhatIf(TypedDict):
    """The console's what-if of one market."""

    market: str
    current: float  # the reserve in force, $/s
    window_s: float
    rounds: int  # queues kept in the window
    sampled: int  # of those, taken to clear again
    skipped: int  # of those, left out: past ``BUDGET_S``, or a policy no longer known
    recorded: float | None  # recorded revenue per sampled round; None: no round was sampled
    recorded_at_current: bool  # every sampled round cleared at the current reserve
    points: list[WhatIfPoint]  # by reserve, ascending
    elapsed_s: float  # how long working it out took


def _index_key(market: str) -> str:
    return f"live:whatif:{market}"


def whatif_keep(record: RoundRecord, *, now: float | None = None) -> bool:
    """Keep ``record``'s waiting queue for the what-if if it carries one and the market's last
    was kept ``KEEP_INTERVAL_S`` ago or more; whether it was kept. Never raises."""
    queue = record.get("queue")
    if queue is None:
        return False
    market = record["market"]
    try:
        if not cache.add(f"{_index_key(market)}:gate", 1, timeout=KEEP_INTERVAL_S):
            return False
        at = time.time() if now is None else now
        kept: KeptRound = {
            "at": at,
            "round_id": record["round_id"],
            "policy": record["policy"],
            "reserve": float(record["reserve"]),
            "tokens_per_second": float(record["tokens_per_second"]),
            "admitted": [a["position"] for a in record["admitted"]],
            "charges": [a["charge"] for a in record["admitted"]],
            "queue": queue,
        }
        key = f"{_index_key(market)}:{uuid.uuid4().hex}"
        cache.set(key, kept, timeout=WINDOW_S)
        with cache_lock(_index_key(market)) as locked:
            if not locked:
                cache.delete(key)
                return False
            index = [(t, k) for t, k in cache.get(_index_key(market)) or [] if t > at - WINDOW_S]
            index.append((at, key))
            cache.set(_index_key(market), index[-KEPT_MAX:], timeout=WINDOW_S)
        return True
    except Exception:
        logger.exception("what-if: keeping round %s failed", record.get("round_id"))
        return False


def _window(market: str, window_s: float, now: float | None) -> list[str]:
    """The keys of the market's kept rounds of the last ``window_s`` seconds, oldest first."""
    since = (time.time() if now is None else now) - window_s
    return [k for t, k in cache.get(_index_key(market)) or [] if t > since]


def _kept(keys: list[str]) -> list[KeptRound]:
    found = cache.get_many(keys)
    return [found[k] for k in keys if k in found]


def whatif_rounds(
    market: str, *, window_s: float = WINDOW_S, now: float | None = None
) -> list[KeptRound]:
    """The market's kept rounds of the last ``window_s`` seconds, oldest first."""
    return _kept(_window(market, window_s, now))


def _sampled(keys: list[str], limit: int) -> list[str]:
    """At most ``limit`` of ``keys``, evenly spaced, the first and the last among them."""
    n = len(keys)
    if n <= limit:
        return keys
    return [keys[i * (n - 1) // (limit - 1)] for i in range(limit)]


def whatif_for_market(
    market: str, *, current: float, window_s: float = WINDOW_S, now: float | None = None
) -> ReserveWhatIf:
    """The what-if of ``market`` around the ``current`` reserve ($/s), cached ``CACHE_S`` or
    until another round is kept."""
    index = cache.get(_index_key(market)) or []
    last = index[-1][1] if index else ""  # a round kept since: worked out again
    key = f"{_index_key(market)}:result:{to_ticks(current)}:{int(window_s)}:{last}"
    got: ReserveWhatIf | None = cache.get(key)
    if got is None:
        got = whatif_compute(market, current=current, window_s=window_s, now=now)
        if got["points"]:  # none yet: the first kept round shows at the next poll
            cache.set(key, got, timeout=CACHE_S)
    return got


def whatif_compute(
    market: str, *, current: float, window_s: float = WINDOW_S, now: float | None = None
) -> ReserveWhatIf:
    """The what-if of ``market``, worked out now (``whatif_for_market`` caches it)."""
    started = time.perf_counter()
    window = _window(market, window_s, now)
    sampled = _kept(_sampled(window, SAMPLE))  # read only those
    grid = reserve_grid([b for r in sampled for b in r["queue"]["bid"]], current=current)
    sums: dict[float, list[float]] = {r: [0.0, 0.0, 0.0, 0.0] for r in grid}
    used: list[KeptRound] = []
    # Spread over the window whatever the budget leaves out: every fourth first, and so on.
    for kept in [k for start in range(4) for k in sampled[start::4]]:
        if used and time.perf_counter() - started > BUDGET_S:
            break
        try:
            outcomes = queue_reclear(
                kept["queue"],
                policy=kept["policy"],
                tokens_per_second=kept["tokens_per_second"],
                admitted=kept["admitted"],
                reserves=grid,
            )
        except ValueError:  # a record this code cannot clear (an unknown policy name, for one)
            continue
        used.append(kept)
        for o in outcomes:
            s = sums[o.reserve]
            s[0] += o.revenue
            s[1] += o.welfare
            s[2] += o.priority
            s[3] += o.waiting
    n = len(used)
    points: list[WhatIfPoint] = [
        {
            "reserve": r,
            "revenue": s[0] / n,
            "welfare": s[1] / n,
            "priority_share": s[2] / s[3] if s[3] else 0.0,
        }
        for r, s in sums.items()
        if n
    ]
    return {
        "market": market,
        "current": current,
        "window_s": window_s,
        "rounds": len(window),
        "sampled": len(sampled),
        "skipped": len(sampled) - n,
        "recorded": sum(sum(k["charges"]) for k in used) / n if n else None,
        "recorded_at_current": bool(used)
        and all(to_ticks(k["reserve"]) == to_ticks(current) for k in used),
        "points": points,
        "elapsed_s": time.perf_counter() - started,
    }


def whatif_clear(market: str) -> None:
    """Forget the market's kept rounds (tests)."""
    keys: list[Any] = [k for _, k in cache.get(_index_key(market)) or []]
    cache.delete_many([*keys, _index_key(market), f"{_index_key(market)}:gate"])
