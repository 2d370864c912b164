"""Requests and the ledger: what each served request was charged, exactly (docs/mechanism.md,
"Rounds and charging"; docs/ledger.md, "Money and the ledger").

A request pays two parts, each one :class:`LedgerEntry`, both written when the gateway settles
it from the engine's answer: the priority charge the engine computed in the round that admitted
it, and the token charge at the market's posted prices. The unique key (request, kind) makes
replays change nothing. Entries are never updated or deleted.
"""

from typing import NotRequired, TypedDict

from django.db import models
from django.db.models import Q

from accounts.models.keys import ApiKey
from accounts.models.tenants import Tenant
from accounts.money import MoneyField, money_str


class RequestStatus(models.TextChoices):
    QUEUED = "queued", "Queued"  # sent to the engine, not finished
    SERVED = "served", "Served"  # completed and settled: its charges are in the ledger
    FAILED = "failed", "Failed"  # not served (engine down, client gone, ...); never charged


class BidSource(models.TextChoices):
    EXPLICIT = "explicit", "Explicit"  # the request carried a bid (body or X-Bid)
    AUTOBID = "autobid", "Autobidder"  # the tenant's autobidder chose it
    NONE = "none", "None"  # no bid and no autobidder: 0
    TIER = "tier", "Service tier"  # OpenAI's service_tier: flex bids 0, priority the quote


class Request(models.Model):
    """The gateway's record of one request to an engine.

    Its primary key ``request_id`` is the engine's rid, so the ledger's ``request_id`` column
    holds that rid too.
    """

    request_id = models.CharField(max_length=200, primary_key=True)
    # Indexed by request_tenant_time (its leading column): an index of its own would only cost
    # every insert (so for the other foreign keys here and in the ledger's other tables).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="requests", db_index=False
    )
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.PROTECT, related_name="requests"
    )
    market = models.ForeignKey("market.Market", on_delete=models.PROTECT, related_name="+")
    bid = MoneyField(default=0, help_text="Dollars per second of waiting, as sent.")
    priority_cap = MoneyField(
        null=True,
        blank=True,
        help_text="The most its priority charge may be, dollars: what the tenant consented to "
        "(effective bid x the market's max_wait_s, or the autobid's worst case). Empty: no cap.",
    )
    request_class = models.CharField(max_length=50, default="interactive")
    bid_source = models.CharField(max_length=8, choices=BidSource.choices, default=BidSource.NONE)
    status = models.CharField(
        max_length=8, choices=RequestStatus.choices, default=RequestStatus.QUEUED
    )
    gateway = models.CharField(
        max_length=32,
        blank=True,
        default="",
        db_default="",
        help_text="The gateway process that admitted it and holds its hold (its instance id, "
        "accounts.services.gateways): when that process stops beating, its requests still "
        "queued are failed uncharged. Empty: not admitted by a gateway process.",
    )
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    ttft_s = models.FloatField(null=True, blank=True, help_text="Time to first token, seconds.")
    e2e_s = models.FloatField(null=True, blank=True, help_text="End-to-end latency, seconds.")

    class Meta:
        ordering = ["-created_at", "-request_id"]
        indexes = [models.Index(fields=["tenant", "created_at"], name="request_tenant_time")]

    def __str__(self) -> str:
        return self.request_id


class ChargeKind(models.TextChoices):
    # The truthful priority charge (docs/mechanism.md, "Payments").
    PRIORITY = "priority", "Priority"
    TOKENS = "tokens", "Tokens"  # posted prices x tokens used


class CapDetail(TypedDict, total=False):
    """What a cap cut from a charge (written by the settle statement,
    ``accounts.ledger.statements``), amounts as exact strings; absent when nothing was cut."""

    capped_at: str  # the amount written
    capped_by: str  # "priority_cap", "budget" or "autobidder_budget"
    uncapped: str  # the amount asked


class BlockDetail(TypedDict):
    """The top-level subtree a request waited in at its round (a round record's ``block``)."""

    prefix_tokens: int
    requests: int
    bid_mean: float  # $/s
    density: float  # $/s per uncached token


class PriorityDetail(CapDetail):
    """A priority entry's detail: the admitting round's view of the request, as the engine
    reported it in the answer's ``meta_info``."""

    bid: float  # $/s, as sent
    effective_bid: float  # 0 under the reserve
    time_saved_s: float
    planned_completion_s: float
    position: int
    engine_charge: float  # dollars, as the engine computed it
    block: BlockDetail
    engine: NotRequired[str]  # the replica that served it (its round record's engine id)
    # Its place in line when it joined the queue (1 first), the requests planned ahead of it and
    # those waiting then (the engine's round record's ``rank``, ``ahead``, ``queue_len``).
    rank: NotRequired[int]
    ahead: NotRequired[int]
    queue_len: NotRequired[int]


class TokensDetail(CapDetail):
    """A token entry's detail: the counts it was priced from."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


TOKEN_COUNTS = ("prompt_tokens", "cached_tokens", "completion_tokens")  # a TokensDetail's keys


class LedgerEntry(models.Model):
    """One charge to a tenant, in exact dollars. One per (request, kind): replays add nothing."""

    # request, tenant, api_key: indexed as the leading column of ledger_one_per_request_kind,
    # ledger_tenant_time and ledger_key_time (no index of their own; see Request.tenant).
    request = models.ForeignKey(
        Request, on_delete=models.PROTECT, related_name="ledger_entries", db_index=False
    )
    kind = models.CharField(max_length=8, choices=ChargeKind.choices)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="ledger_entries", db_index=False
    )
    api_key = models.ForeignKey(
        ApiKey,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="ledger_entries",
        db_index=False,
    )
    market = models.ForeignKey("market.Market", on_delete=models.PROTECT, related_name="+")
    round_id = models.CharField(max_length=200, blank=True, help_text="Priority charges only.")
    amount = MoneyField(help_text="Dollars.")
    # PriorityDetail or TokensDetail, by kind.
    detail = models.JSONField(default=dict, blank=True, help_text="Tokens, bid, time saved.")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "ledger entries"
        constraints = [
            models.UniqueConstraint(fields=["request", "kind"], name="ledger_one_per_request_kind"),
            models.CheckConstraint(condition=Q(amount__gte=0), name="ledger_amount_not_negative"),
        ]
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="ledger_tenant_time"),
            models.Index(fields=["api_key", "created_at"], name="ledger_key_time"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} ${money_str(self.amount)} for {self.request_id}"
