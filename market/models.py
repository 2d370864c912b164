"""Markets (one per served model) and the audit trail of their reserve prices.

Money columns are exact ``Decimal`` dollars with 9 places (``accounts.money``): posted token
prices in dollars per million tokens, the reserve in dollars per second of waiting.
"""

from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from accounts.money import MoneyField
from accounts.rules import HOLD_HORIZON_PRIOR_S
from mechanism import DEFAULT_POLICY, POLICIES, wait_bound
from mechanism.aging import WAIT_BOUND_MAX_S, WAIT_BOUND_MIN_S, wait_bound_checked

DEFAULT_ENGINE_URL = "http://127.0.0.1:30000"
SIMPLE_CHAT_TEMPLATE = "simple"  # the simulated engine's tokenizer (engines.sim)
DEFAULT_RESERVE_MAX = Decimal("1.000000000")  # $/s: far above the demo's bids (0.001-0.05 $/s)
DEFAULT_AUTO_RESERVE_TARGET_S = 2.0  # seconds: the service tier "priority"'s default target


def policy_known(value: str) -> None:
    """A market's policy is a name in the mechanism's registry (``mechanism.POLICIES``):
    checked against the registry as it is, so a new policy needs no migration."""
    if value not in POLICIES:
        raise ValidationError(
            "%(value)r is not a policy; the policies are %(names)s",
            params={"value": value, "names": ", ".join(POLICIES)},
        )


def wait_bound_known(value: float) -> None:
    """A market's wait bound is 0 (off) or in the mechanism's range (``wait_bound_checked``)."""
    try:
        wait_bound_checked(value)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


class Market(models.Model):
    """One served model: its posted token prices, its reserve price, its ordering policy, and
    where its engines are: one entry point (``engine_url``: SGLang's router in front of the
    market's replicas, or its one engine) and the replicas themselves (``Replica``), which the
    market's controls and status reach one by one."""

    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=200)
    served_model = models.CharField(
        max_length=200, help_text="The model name the engine serves (the API's `model`)."
    )
    price_input_per_mtok = MoneyField(
        help_text="Dollars per million uncached prompt tokens.", default=0
    )
    price_cached_input_per_mtok = MoneyField(
        help_text="Dollars per million prompt tokens already in the KV cache.", default=0
    )
    price_output_per_mtok = MoneyField(
        help_text="Dollars per million completion tokens.", default=0
    )
    reserve = MoneyField(
        default=0,
        help_text="Reserve price, dollars per second of waiting: lower bids buy no priority.",
    )
    reserve_max = MoneyField(
        default=DEFAULT_RESERVE_MAX,
        help_text="The highest reserve the console and the admin accept, dollars per second: a "
        "guard against a slip of the keyboard (a higher one is refused until this is raised).",
    )
    policy = models.CharField(
        max_length=32,
        default=DEFAULT_POLICY,
        validators=[policy_known],
        help_text="The engines' ordering policy, a name in the mechanism's registry.",
    )
    engine_url = models.CharField(
        max_length=500,
        default=DEFAULT_ENGINE_URL,
        help_text="Base URL of the market's entry point (SGLang's native HTTP API): the router "
        "in front of its replicas, or its one engine.",
    )
    chat_template = models.CharField(
        max_length=200,
        default=SIMPLE_CHAT_TEMPLATE,
        help_text='How chat messages become a prompt: "simple" (the simulated engine\'s '
        "tokenizer) or a Hugging Face model id whose tokenizer's chat template applies.",
    )
    max_wait_s = models.FloatField(
        default=60.0,
        help_text="Bound on a request's planned wait, seconds: the most a bid consents to pay is "
        "bid x this (its priority cap).",
    )
    priority_ttft_s = models.FloatField(
        default=2.0,
        help_text="The service tier 'priority' bids the quote for a first token within this "
        "many seconds ...",
    )
    priority_probability = models.FloatField(
        default=0.9,
        help_text="... this share of the time (0..1), never above the tenant's priority bid cap.",
    )
    hold_horizon_s = models.FloatField(
        default=HOLD_HORIZON_PRIOR_S,
        help_text="Seconds of its effective bid a request's priority holds against its budget: "
        "what recent requests were charged per $/s of bid (a high quantile), renewed by the "
        "periodic step (accounts.rules.hold_horizon_s).",
    )
    auto_reserve = models.BooleanField(
        default=False,
        help_text="Whether the reserve follows its target wait (market.reserves, every "
        "AUTO_RESERVE_INTERVAL_S); a manual change of the reserve turns it off.",
    )
    auto_reserve_target_s = models.FloatField(
        default=DEFAULT_AUTO_RESERVE_TARGET_S,
        help_text="The automatic reserve's target, seconds: requests whose bids buy priority "
        "see a time to first token at most this long at the 90th percentile.",
    )
    alert_queue = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The console alerts when more requests than this wait (empty: never).",
    )
    alert_ttft_p99_s = models.FloatField(
        null=True,
        blank=True,
        help_text="The console alerts when the TTFT p99 is above this many seconds (empty: never).",
    )

    class WaitBoundMode(models.TextChoices):
        AUTO = wait_bound.AUTO, "auto: set from the market's recent waits"
        PINNED = wait_bound.PINNED, "pinned by an operator"
        OFF = wait_bound.OFF, "off"

    wait_bound_s = models.FloatField(
        default=wait_bound.PRIOR_S,
        validators=[wait_bound_known],
        help_text="The wait bound in force, seconds (0: off). What it does: "
        "mechanism.aging.WAIT_BOUND_HELP, which the console and the admin show.",
    )
    wait_bound_mode = models.CharField(
        max_length=8,
        choices=WaitBoundMode.choices,
        default=wait_bound.AUTO,
        help_text="Where the wait bound comes from: auto (renewed from the market's recent "
        "waits by mechanism.wait_bound, every AUTO_RESERVE_INTERVAL_S), pinned, or off (0 s).",
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(price_input_per_mtok__gte=0)
                & models.Q(price_cached_input_per_mtok__gte=0)
                & models.Q(price_output_per_mtok__gte=0)
                & models.Q(reserve__gte=0),
                name="market_amounts_not_negative",
            ),
            models.CheckConstraint(
                condition=models.Q(reserve__lte=models.F("reserve_max")),
                name="market_reserve_within_its_ceiling",
            ),
            models.CheckConstraint(
                condition=models.Q(max_wait_s__gt=0), name="market_max_wait_positive"
            ),
            models.CheckConstraint(
                condition=models.Q(auto_reserve_target_s__gt=0),
                name="market_auto_reserve_target_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(alert_ttft_p99_s__isnull=True)
                | models.Q(alert_ttft_p99_s__gt=0),
                name="market_alert_ttft_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(wait_bound_s=0)
                | models.Q(wait_bound_s__gte=WAIT_BOUND_MIN_S, wait_bound_s__lte=WAIT_BOUND_MAX_S),
                name="market_wait_bound_off_or_in_range",
            ),
            models.CheckConstraint(
                condition=models.Q(wait_bound_mode=wait_bound.OFF, wait_bound_s=0)
                | (~models.Q(wait_bound_mode=wait_bound.OFF) & models.Q(wait_bound_s__gt=0)),
                name="market_wait_bound_zero_when_off",
                violation_error_message="A wait bound that is off is 0 s; one that is on is "
                "longer (auto or pinned).",
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class Replica(models.Model):
    """One engine of a market behind its entry point: its base URL, its engine id (what its
    round records call it), and whether the market uses it (controls pushed, status polled)."""

    market = models.ForeignKey(Market, on_delete=models.CASCADE, related_name="replicas")
    url = models.CharField(max_length=500, help_text="Base URL of the engine itself.")
    engine_id = models.CharField(
        max_length=200,
        unique=True,
        help_text="The engine id its round records carry (unique across markets).",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["market", "engine_id"]
        constraints = [
            models.UniqueConstraint(fields=["market", "url"], name="replica_url_once_per_market")
        ]

    def __str__(self) -> str:
        return f"{self.market}: {self.engine_id} at {self.url}"


class ReserveChange(models.Model):
    """Who moved a market's reserve price, from what, to what, and when (dollars per second);
    ``automatic``: the automatic reserve's step moved it (``changed_by`` is then None)."""

    market = models.ForeignKey(Market, on_delete=models.CASCADE, related_name="reserve_changes")
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    automatic = models.BooleanField(default=False)
    old = MoneyField()
    new = MoneyField()
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.market}: {self.old} -> {self.new}"


class ControlChange(models.Model):
    """Who switched a market's policy, moved its reserve ceiling, turned its automatic reserve on
    or off, set its alert thresholds or its wait bound, from what, to what, and when (the
    reserve's own changes are ``ReserveChange``); ``automatic``: the automatic wait bound's
    renewal moved it (``changed_by`` is then None)."""

    class Control(models.TextChoices):
        POLICY = "policy", "Ordering policy"
        RESERVE_MAX = "reserve_max", "Reserve ceiling ($/s)"
        AUTO_RESERVE = "auto_reserve", "Automatic reserve"
        ALERT_QUEUE = "alert_queue", "Queue alert (requests waiting)"
        ALERT_TTFT = "alert_ttft_p99", "TTFT p99 alert (s)"
        WAIT_BOUND = "wait_bound_s", "Wait bound (s)"

    market = models.ForeignKey(Market, on_delete=models.CASCADE, related_name="control_changes")
    control = models.CharField(max_length=16, choices=Control.choices)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    automatic = models.BooleanField(default=False)
    old = models.CharField(max_length=64)
    new = models.CharField(max_length=64)
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.market}: {self.control} {self.old} -> {self.new}"
