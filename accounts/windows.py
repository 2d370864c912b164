"""Budget windows, computed from the clock when they are read (docs/ledger.md, "Budgets and holds").

Windows are UTC calendar periods, half-open ``[start, end)``: a day starts at 00:00 UTC, a week
on Monday 00:00 UTC, a month on the 1st at 00:00 UTC. A budget with period "none" never resets:
its window starts at the Unix epoch and has no end. Nothing is stored, so there is no reset job,
and a budget whose period or limit changes mid-window simply reads the window its new period
gives at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Window:
    """One budget window, ``[start, end)``; ``end`` is None when it never ends."""

    start: datetime
    end: datetime | None

    def seconds_until_end(self, now: datetime) -> float | None:
        """Seconds from ``now`` to the next reset, None when there is none."""
        return None if self.end is None else (self.end - now).total_seconds()


def window_for(*, period: str, now: datetime) -> Window:
    """The window of ``period`` ("day", "week", "month" or "none") that contains ``now``.

    ``now`` must be timezone-aware; it is converted to UTC.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    now = now.astimezone(UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return Window(midnight, midnight + timedelta(days=1))
    if period == "week":
        start = midnight - timedelta(days=midnight.weekday())  # Monday is 0
        return Window(start, start + timedelta(days=7))
    if period == "month":
        start = midnight.replace(day=1)
        end = start.replace(year=start.year + (start.month == 12), month=start.month % 12 + 1)
        return Window(start, end)
    if period == "none":
        return Window(EPOCH, None)
    raise ValueError(f"unknown budget period {period!r}")
