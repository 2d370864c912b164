"""The markets' hold horizons: how long a hold assumes a request may wait, renewed from each
market's recent priority charges (celery beat: ``market.hold_horizons_renew``)."""

from __future__ import annotations

from decimal import Decimal

from accounts.models import ChargeKind, LedgerEntry
from accounts.rules import HOLD_WINDOW, hold_horizon_s
from market.models import Market


def hold_horizon_renew(*, market: Market, **rule: float) -> float:
    """Renew the market's hold horizon (seconds) from its last priced requests: what each was
    charged (uncut) per $/s of effective bid (``accounts.rules.hold_horizon_s``; ``rule``: its
    margin or floor, for the benchmark's alternatives)."""
    rows = (
        LedgerEntry.objects.filter(market=market, kind=ChargeKind.PRIORITY)
        .order_by("-created_at", "-id")
        .values_list("amount", "detail")[:HOLD_WINDOW]
    )
    charged_s = []
    for amount, detail in rows:
        effective = detail.get("effective_bid")
        if isinstance(effective, int | float) and effective > 0:
            charged_s.append(float(Decimal(detail.get("uncapped", amount))) / effective)
    horizon = hold_horizon_s(charged_s, max_wait_s=market.max_wait_s, **rule)
    if horizon != market.hold_horizon_s:
        Market.objects.filter(pk=market.pk).update(hold_horizon_s=horizon)
        market.hold_horizon_s = horizon
    return horizon


def hold_horizons_renew() -> int:
    """Renew every active market's hold horizon (the periodic step); how many markets."""
    markets = list(Market.objects.filter(is_active=True))
    for market in markets:
        hold_horizon_renew(market=market)
    return len(markets)
