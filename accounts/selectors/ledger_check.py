"""The ledger check: what a payments system is judged on after a fault, computed from the rows
alone (``manage.py ledger_check``; the soak and the outage tests run it).

- every served request has exactly one tokens entry and one priority entry;
- no request that failed, or that is still queued, has an entry;
- no hold is open on a request that is finished, and no request is still queued (its hold
  open) longer than ``grace_s`` (``STALE_REQUEST_S``: the sweep's bound);
- each budget counter equals the ledger: ``spent_total`` the sum of its entries, ``held`` the
  sum of its open holds' ``remaining``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from accounts.models import (
    BudgetCounter,
    ChargeKind,
    Hold,
    HoldState,
    LedgerEntry,
    Request,
    RequestStatus,
)
from accounts.money import ZERO


@dataclass(frozen=True)
class LedgerCheck:
    """What the check counted; :attr:`ok` when nothing is wrong."""

    requests: int
    served: int
    failed: int
    queued: int
    served_not_charged_once: list[str] = field(default_factory=list)  # request ids
    charged_not_served: list[str] = field(default_factory=list)
    open_holds_of_finished: list[str] = field(default_factory=list)
    queued_past_grace: list[str] = field(default_factory=list)
    counters_off: list[str] = field(default_factory=list)  # "tenant 3 key -: spent ... != ..."

    @property
    def ok(self) -> bool:
        return not (
            self.served_not_charged_once
            or self.charged_not_served
            or self.open_holds_of_finished
            or self.queued_past_grace
            or self.counters_off
        )

    def lines(self) -> list[str]:
        """The check as lines for people: the counts, then each kind of fault with up to three
        examples."""
        out = [
            f"{self.requests} requests: {self.served} served, {self.failed} failed, "
            f"{self.queued} queued"
        ]
        for name, ids in (
            (
                "served but not charged exactly once (tokens and priority)",
                self.served_not_charged_once,
            ),
            ("charged but not served", self.charged_not_served),
            ("finished with a hold still open", self.open_holds_of_finished),
            ("queued past the sweep's bound", self.queued_past_grace),
            ("budget counters not equal to the ledger", self.counters_off),
        ):
            examples = "; ".join(ids[:3]) + (" ..." if len(ids) > 3 else "")
            out.append(f"{name}: {len(ids)}" + (f" ({examples})" if ids else ""))
        out.append("ledger check: " + ("ok" if self.ok else "FAILED"))
        return out


def ledger_check(*, grace_s: float, now: datetime | None = None) -> LedgerCheck:
    """The ledger check over every row (see the module's docstring)."""
    now = now or timezone.now()
    statuses = dict(
        Request.objects.values_list("status").annotate(n=Count("request_id")).order_by()
    )
    served = Request.objects.filter(status=RequestStatus.SERVED)
    entries_of_served = served.annotate(
        tokens=Count("ledger_entries", filter=Q(ledger_entries__kind=ChargeKind.TOKENS)),
        priority=Count("ledger_entries", filter=Q(ledger_entries__kind=ChargeKind.PRIORITY)),
    ).exclude(tokens=1, priority=1)
    charged_not_served = (
        LedgerEntry.objects.exclude(request__status=RequestStatus.SERVED)
        .values_list("request_id", flat=True)
        .distinct()
    )
    open_of_finished = Hold.objects.filter(state=HoldState.OPEN).exclude(
        request_id__in=Request.objects.filter(status=RequestStatus.QUEUED).values("request_id")
    )
    past_grace = Request.objects.filter(
        status=RequestStatus.QUEUED, created_at__lt=now - timedelta(seconds=grace_s)
    )
    return LedgerCheck(
        requests=sum(statuses.values()),
        served=statuses.get(RequestStatus.SERVED, 0),
        failed=statuses.get(RequestStatus.FAILED, 0),
        queued=statuses.get(RequestStatus.QUEUED, 0),
        served_not_charged_once=list(entries_of_served.values_list("request_id", flat=True)),
        charged_not_served=list(charged_not_served),
        open_holds_of_finished=list(open_of_finished.values_list("request_id", flat=True)),
        queued_past_grace=list(past_grace.values_list("request_id", flat=True)),
        counters_off=_counters_off(),
    )


def _by_counter(rows: QuerySet, field: str) -> dict[tuple[int, int | None], Decimal]:
    """The sum of ``field`` over ``rows`` for each counter row: a key's, and its tenant's (key
    None: all of the tenant's rows)."""
    sums: dict[tuple[int, int | None], Decimal] = {}
    for tenant, key, total in (
        rows.values_list("tenant_id", "api_key_id").annotate(total=Sum(field)).order_by()
    ):
        sums[(tenant, None)] = sums.get((tenant, None), ZERO) + total
        if key is not None:
            sums[(tenant, key)] = total
    return sums


def _counters_off() -> list[str]:
    """Budget counters whose spend or held amount differs from the ledger's and the holds'."""
    spent = _by_counter(LedgerEntry.objects.all(), "amount")
    held = _by_counter(Hold.objects.filter(state=HoldState.OPEN), "remaining")
    off = []
    for counter in BudgetCounter.objects.all():
        at = (counter.tenant_id, counter.api_key_id)
        want_spent, want_held = spent.get(at, ZERO), held.get(at, ZERO)
        if counter.spent_total != want_spent or counter.held != want_held:
            off.append(
                f"tenant {at[0]} key {at[1] or '-'}: spent {counter.spent_total} (ledger "
                f"{want_spent}), held {counter.held} (open holds {want_held})"
            )
    return off
