"""The once-a-second live work: engine status, spend of token charges, idle books.

:func:`live_tick` is what celery beat runs every second (``market.live_publish``):

- scrape each active market's engine ``/metrics`` and send its :class:`EngineStatus`; an engine
  that reports an empty queue gets an empty book (no round reports a queue that drained);
- write back each active market's control store found missing or older than the market's last
  change (``market.engine_control.controls_refresh``: one read of all the keys, a write only
  when stale), so the engines following it run the market's values again within their poll
  after Redis lost its data, a value pushed to one engine's own control path included;
- send a spend tick to every tenant charged in the last ``SPEND_LOOKBACK_S`` seconds: token
  charges settle in the gateway, not in rounds, so this is how they reach the dashboards.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from accounts.selectors.live import tenants_active_since
from market.engine_control import controls_refresh
from market.live.book import book_clear
from market.live.engine_status import engine_status_poll
from market.live.send import group_send_many
from market.live.spend import spend_ticks_publish
from market.payloads import Payload, market_group
from market.selectors import markets_active

logger = logging.getLogger(__name__)

# Ticks a second apart cover this much, so a late tick misses nothing (a request seen twice is
# merged by the browser).
SPEND_LOOKBACK_S = 2.5


@dataclass
class LiveTick:
    """What one tick did."""

    markets: int = 0
    engines_up: int = 0
    books_cleared: int = 0
    tenants: int = 0
    controls_written: int = 0  # control stores written back

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def live_tick(*, spend_lookback_s: float = SPEND_LOOKBACK_S) -> LiveTick:
    """One round of the periodic live work (never raises for an engine that is down)."""
    tick = LiveTick()
    messages: list[tuple[str, Payload]] = []
    markets = list(markets_active().prefetch_related("replicas"))
    tick.controls_written = len(controls_refresh(markets))
    for market in markets:
        tick.markets += 1
        replicas = [(r.engine_id, r.url) for r in market.replicas.all() if r.enabled]
        if not market.engine_url and not replicas:
            continue
        status = engine_status_poll(
            market=market.slug, engine_url=market.engine_url, replicas=replicas
        )
        messages.append((market_group(market.slug), status))
        if status["up"]:
            tick.engines_up += 1
            if status["queue"] == 0 and book_clear(market=market.slug):
                tick.books_cleared += 1
    group_send_many(messages)
    since = timezone.now() - timedelta(seconds=spend_lookback_s)
    tick.tenants = spend_ticks_publish(requests_by_tenant=tenants_active_since(since=since))
    return tick
