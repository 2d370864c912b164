"""The markets' automatic reserves: each interval, a market whose automatic reserve is on moves
its reserve toward its target wait by the mechanism's rule (``mechanism.reserve``), audited as a
``ReserveChange`` marked automatic (celery beat: ``market.reserves_auto_step``).

The engines learn of a move as of a manual one: the task queues the push of each market it moved
(``market.tasks``), once the step has committed.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from accounts.money import money
from market.models import Market, ReserveChange
from market.selectors import finished_in_interval
from mechanism.reserve import reserve_step


def reserve_auto_step(
    *, market_id: int, interval_s: float, now: datetime | None = None
) -> ReserveChange | None:
    """One step of the market's automatic reserve over the requests it served in the last
    ``interval_s`` seconds before ``now``; the move (None: auto off, or nothing moved).

    The market row is locked for the step, so a manual change in between (which turns the
    automatic reserve off) is either before it (then nothing moves) or after it (and wins)."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = Market.objects.select_for_update().get(pk=market_id)
        if not (locked.auto_reserve and locked.is_active):
            return None
        finished = finished_in_interval(
            market=locked, since=now - timedelta(seconds=interval_s), until=now
        )
        step = reserve_step(
            float(locked.reserve),
            finished,
            target_s=locked.auto_reserve_target_s,
            ceiling=float(locked.reserve_max),
        )
        new = min(money(step.reserve), locked.reserve_max)  # the money's one rounding rule
        if new == locked.reserve:
            return None
        change = ReserveChange.objects.create(
            market=locked, changed_by=None, automatic=True, old=locked.reserve, new=new, at=now
        )
        Market.objects.filter(pk=market_id).update(reserve=new, updated_at=timezone.now())
    return change


def reserves_auto_step(*, interval_s: float, now: datetime | None = None) -> list[ReserveChange]:
    """One step of every active market whose automatic reserve is on; the moves made."""
    ids = Market.objects.filter(is_active=True, auto_reserve=True).values_list("pk", flat=True)
    moves = (reserve_auto_step(market_id=pk, interval_s=interval_s, now=now) for pk in ids)
    return [move for move in moves if move is not None]
