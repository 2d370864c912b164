"""Budget windows are UTC calendar periods computed from the clock, half-open [start, end)."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from accounts.windows import EPOCH, window_for


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_day_window() -> None:
    w = window_for(period="day", now=utc(2026, 11, 18, 15, 30))
    assert (w.start, w.end) == (utc(2026, 11, 18), utc(2026, 11, 19))
    assert w.seconds_until_end(utc(2026, 11, 18, 15, 30)) == 8.5 * 3600


def test_the_boundary_instant_belongs_to_the_new_window() -> None:
    w = window_for(period="day", now=utc(2026, 11, 19))
    assert w.start == utc(2026, 11, 19)
    before = window_for(period="day", now=utc(2026, 11, 19) - timedelta(microseconds=1))
    assert before.start == utc(2026, 11, 18)


def test_week_starts_on_monday() -> None:
    # 2026-11-18 is a Wednesday; that week's Monday is the 16th.
    w = window_for(period="week", now=utc(2026, 11, 18, 15, 30))
    assert (w.start, w.end) == (utc(2026, 11, 16), utc(2026, 11, 23))
    # A Monday at midnight starts its own week; Sunday 23:59 is still the old one.
    assert window_for(period="week", now=utc(2026, 11, 23)).start == utc(2026, 11, 23)
    assert window_for(period="week", now=utc(2026, 11, 22, 23, 59)).start == utc(2026, 11, 16)


def test_month_window_and_year_end() -> None:
    w = window_for(period="month", now=utc(2026, 11, 18, 15, 30))
    assert (w.start, w.end) == (utc(2026, 11, 1), utc(2026, 12, 1))
    dec = window_for(period="month", now=utc(2026, 12, 31, 23, 59))
    assert (dec.start, dec.end) == (utc(2026, 12, 1), utc(2027, 1, 1))
    feb = window_for(period="month", now=utc(2028, 2, 29, 12))
    assert (feb.start, feb.end) == (utc(2028, 2, 1), utc(2028, 3, 1))


def test_none_never_resets() -> None:
    w = window_for(period="none", now=utc(2026, 11, 18))
    assert w.start == EPOCH and w.end is None
    assert w.seconds_until_end(utc(2026, 11, 18)) is None


def test_other_time_zones_are_converted_to_utc() -> None:
    # 2026-11-19 01:00 at UTC+2 is 2026-11-18 23:00 UTC: still the 18th's day.
    plus_two = timezone(timedelta(hours=2))
    w = window_for(period="day", now=datetime(2026, 11, 19, 1, 0, tzinfo=plus_two))
    assert w.start == utc(2026, 11, 18)


def test_bad_input() -> None:
    with pytest.raises(ValueError):
        window_for(period="day", now=datetime(2026, 11, 18))
    with pytest.raises(ValueError):
        window_for(period="fortnight", now=utc(2026, 11, 18))
