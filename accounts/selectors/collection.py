"""What the ledger collected of what the engines asked, and what the settlement rule cut
(``accounts.rules``): the price of holds sized to what requests are likely to cost."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Q, Sum

from accounts.models import ChargeKind, LedgerEntry
from accounts.money import ZERO
from accounts.rules import AUTOBIDDER_BUDGET, BUDGET, PRIORITY_CAP


@dataclass(frozen=True)
class Collection:
    """Dollars over some entries: the priority charges written, and what cuts left out."""

    priority: Decimal  # priority charges written (the market's priority revenue)
    tokens: Decimal  # token charges written
    uncollected: Decimal  # cut by a tenant's or key's budget: a charge above its hold at the edge
    given_away: Decimal  # cut by an autobidder's budget (its safety rule, by design)
    over_consent: Decimal  # cut to the request's priority cap: never owed

    @property
    def uncollected_share(self) -> float:
        """Uncollected over priority revenue (0 with no revenue)."""
        return float(self.uncollected / self.priority) if self.priority else 0.0


def collection(
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    market_id: int | None = None,
    tenant_id: int | None = None,
) -> Collection:
    """:class:`Collection` of the entries written in [start, end) (either bound may be open),
    of one market and one tenant when given."""
    entries = LedgerEntry.objects.all()
    if start is not None:
        entries = entries.filter(created_at__gte=start)
    if end is not None:
        entries = entries.filter(created_at__lt=end)
    if market_id is not None:
        entries = entries.filter(market_id=market_id)
    if tenant_id is not None:
        entries = entries.filter(tenant_id=tenant_id)
    sums = entries.aggregate(
        priority=Sum("amount", filter=Q(kind=ChargeKind.PRIORITY)),
        tokens=Sum("amount", filter=Q(kind=ChargeKind.TOKENS)),
    )
    cut = {BUDGET: ZERO, AUTOBIDDER_BUDGET: ZERO, PRIORITY_CAP: ZERO}
    for detail in entries.filter(detail__has_key="capped_by").values_list("detail", flat=True):
        cut[detail["capped_by"]] += Decimal(detail["uncapped"]) - Decimal(detail["capped_at"])
    return Collection(
        priority=sums["priority"] or ZERO,
        tokens=sums["tokens"] or ZERO,
        uncollected=cut[BUDGET],
        given_away=cut[AUTOBIDDER_BUDGET],
        over_consent=cut[PRIORITY_CAP],
    )
