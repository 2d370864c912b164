"""The markets' automatic wait bounds: each interval, a market whose bound is automatic renews
it from its recent waits by the mechanism's rule (``mechanism.wait_bound``), audited as a
``ControlChange`` marked automatic (celery beat: ``market.wait_bounds_renew``, every
``AUTO_RESERVE_INTERVAL_S``). The engines learn of a move as of an operator's: the task queues
the push of each market it moved (``market.tasks``), once the renewal has committed.

An operator's choice (auto, pinned, off) goes through ``market.services.market_wait_bound_set``;
both write through :func:`wait_bound_write`, the one audited write of a bound.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from market.models import ControlChange, Market
from market.selectors import served_waits
from mechanism import wait_bound

logger = logging.getLogger(__name__)


def wait_bound_text(*, mode: str, wait_bound_s: float) -> str:
    """A wait bound as its audit row writes it: "45" (pinned, seconds), "20 (auto)", "off"."""
    if mode == wait_bound.OFF:
        return "off"
    return f"{wait_bound_s:g}" + (" (auto)" if mode == wait_bound.AUTO else "")


def wait_bound_write(
    locked: Market,
    *,
    mode: str,
    wait_bound_s: float,
    user: AbstractBaseUser | None,
    now: datetime | None,
    automatic: bool = False,
) -> ControlChange | None:
    """Give the locked market this bound, audited (``ControlChange``: by ``user``, or by the
    automatic rule); None when nothing changes. The caller queues the push to the engines."""
    if (locked.wait_bound_mode, locked.wait_bound_s) == (mode, wait_bound_s):
        return None
    change = ControlChange.objects.create(
        market=locked,
        control=ControlChange.Control.WAIT_BOUND,
        changed_by=None if automatic else user,
        automatic=automatic,
        old=wait_bound_text(mode=locked.wait_bound_mode, wait_bound_s=locked.wait_bound_s),
        new=wait_bound_text(mode=mode, wait_bound_s=wait_bound_s),
        at=now or timezone.now(),
    )
    Market.objects.filter(pk=locked.pk).update(
        wait_bound_mode=mode, wait_bound_s=wait_bound_s, updated_at=timezone.now()
    )
    logger.info("market %s: wait bound %s -> %s", locked.slug, change.old, change.new)
    locked.wait_bound_mode, locked.wait_bound_s = mode, wait_bound_s
    return change


def wait_bound_auto_renew(*, market_id: int, now: datetime | None = None) -> ControlChange | None:
    """Renew the market's automatic wait bound from the times to first token of its last
    ``wait_bound.WINDOW`` served requests; the move (None: not automatic, or nothing moved).

    The market row is locked for the renewal, so an operator's change in between (which pins
    the bound or turns it off) is either before it (then nothing moves) or after it (and wins)."""
    with transaction.atomic():
        locked = Market.objects.select_for_update().get(pk=market_id)
        if not (locked.wait_bound_mode == wait_bound.AUTO and locked.is_active):
            return None
        waits = served_waits(market=locked, limit=wait_bound.WINDOW)
        new = wait_bound.wait_bound_renewed(locked.wait_bound_s, waits)
        return wait_bound_write(
            locked, mode=wait_bound.AUTO, wait_bound_s=new, user=None, now=now, automatic=True
        )


def wait_bounds_renew(*, now: datetime | None = None) -> list[ControlChange]:
    """Renew every active market's automatic wait bound; the moves made."""
    ids = Market.objects.filter(is_active=True, wait_bound_mode=wait_bound.AUTO).values_list(
        "pk", flat=True
    )
    moves = (wait_bound_auto_renew(market_id=pk, now=now) for pk in ids)
    return [move for move in moves if move is not None]
