"""Writes and side effects of the market app."""

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from accounts.money import money_exact
from market.models import ControlChange, Market, Replica, ReserveChange
from market.tasks import engine_config_push_enqueue
from market.wait_bounds import wait_bound_write
from mechanism import MAX_BID, wait_bound
from mechanism.aging import WAIT_BOUND_MAX_S, WAIT_BOUND_MIN_S, wait_bound_checked
from mechanism.policies import policy_offered

logger = logging.getLogger(__name__)


class ReserveAboveCeiling(ValueError):
    """A reserve above the market's ceiling (``Market.reserve_max``): refused until the ceiling
    is raised."""

    def __init__(self, reserve: Decimal, ceiling: Decimal) -> None:
        super().__init__(f"reserve {reserve} $/s is above the market's ceiling of {ceiling} $/s")
        self.reserve, self.ceiling = reserve, ceiling


def _who(user: AbstractBaseUser | None) -> AbstractBaseUser | None:
    """The user an audit row names (None: the system, or nobody logged in)."""
    return user if user is not None and user.is_authenticated else None


def market_reserve_set(
    *,
    market: Market,
    reserve: Decimal | str | int,
    user: AbstractBaseUser | None,
    now: datetime | None = None,
) -> ReserveChange | None:
    """Set ``market``'s reserve price (dollars per second of waiting) and audit the change.

    ``reserve`` must be finite, >= 0, at most ``MAX_BID`` (what engines accept) and have at
    most 9 decimal places (ValueError otherwise; a float is refused too: say it as a string),
    and at most the market's ceiling (:class:`ReserveAboveCeiling`, a ValueError).
    The audit row and the new value commit together, with the market row locked so concurrent
    changes record the true old value. Setting the value it already has writes nothing and
    returns None. A person (``user``) setting it takes it in hand: the market's automatic
    reserve, if on, is turned off (audited), even when the value stays.
    """
    new = money_exact(reserve)
    if new > Decimal(str(MAX_BID)):
        raise ValueError(f"reserve must be at most {MAX_BID:g} $/s: {reserve!r}")
    with transaction.atomic():
        locked = Market.objects.select_for_update().get(pk=market.pk)
        if new <= locked.reserve_max and _who(user) is not None and locked.auto_reserve:
            _auto_reserve_write(locked, enabled=False, target_s=None, user=user, now=now)
            market.auto_reserve = False
        if locked.reserve == new:
            market.reserve = new
            return None
        if new > locked.reserve_max:
            raise ReserveAboveCeiling(new, locked.reserve_max)
        change = ReserveChange.objects.create(
            market=locked,
            changed_by=_who(user),
            old=locked.reserve,
            new=new,
            at=now or timezone.now(),
        )
        Market.objects.filter(pk=market.pk).update(reserve=new, updated_at=timezone.now())
        engine_config_push_on_commit(market_id=market.pk)
    market.reserve = new
    return change


def market_policy_set(
    *,
    market: Market,
    policy: str,
    user: AbstractBaseUser | None,
    now: datetime | None = None,
) -> str | None:
    """Set ``market``'s ordering policy (one of ``mechanism.OFFERED``).

    ValueError for an unknown name or a baseline not offered for a market. Returns the old
    policy, or None when it already had this one (nothing written). The change is audited
    (``ControlChange``: who, when, old and new) in the same transaction, and the engine is told
    once it has committed, as for the reserve.
    """
    policy_offered(policy)
    with transaction.atomic():
        locked = Market.objects.select_for_update().get(pk=market.pk)
        old = locked.policy
        if old == policy:
            market.policy = policy
            return None
        ControlChange.objects.create(
            market=locked,
            control=ControlChange.Control.POLICY,
            changed_by=_who(user),
            old=old,
            new=policy,
            at=now or timezone.now(),
        )
        Market.objects.filter(pk=market.pk).update(policy=policy, updated_at=timezone.now())
        who = user.get_username() if user is not None and user.is_authenticated else "system"
        logger.info("market %s: policy %s -> %s by %s", locked.slug, old, policy, who)
        engine_config_push_on_commit(market_id=market.pk)
    market.policy = policy
    return old


def market_wait_bound_set(
    *,
    market: Market,
    wait_bound_s: object = None,
    mode: str | None = None,
    user: AbstractBaseUser | None,
    now: datetime | None = None,
) -> ControlChange | None:
    """Set where ``market``'s wait bound comes from (``mechanism.wait_bound.MODES``):

    - ``auto``: the automatic rule renews it (``market.wait_bounds.wait_bound_auto_renew``),
      from the bound in force (``PRIOR_S`` when it was off); give no ``wait_bound_s``;
    - ``pinned``: ``wait_bound_s`` seconds, in the mechanism's range (``wait_bound_checked``);
    - ``off``: 0 s; give no ``wait_bound_s``, or 0.

    Without ``mode``, a number pins the bound and 0 turns it off. ValueError saying what is
    wrong, and nothing written. None when nothing changes. The change is audited
    (``ControlChange``) and pushed to the engines once committed, with the policy and reserve.
    """
    if mode is None:
        mode = wait_bound.OFF if wait_bound_checked(wait_bound_s) == 0 else wait_bound.PINNED
    if mode not in wait_bound.MODES:
        raise ValueError(f"the wait bound is {', '.join(wait_bound.MODES)}, not {mode!r}")
    if mode == wait_bound.PINNED:
        new = _pinned(wait_bound_s)
    elif wait_bound_s is not None and not (mode == wait_bound.OFF and wait_bound_s == 0):
        raise ValueError(f"the wait bound's length is set by hand only when pinned, not {mode}")
    with transaction.atomic():
        locked = Market.objects.select_for_update().get(pk=market.pk)
        if mode == wait_bound.OFF:
            new = 0.0
        elif mode == wait_bound.AUTO:
            new = locked.wait_bound_s or wait_bound.PRIOR_S
        change = wait_bound_write(locked, mode=mode, wait_bound_s=new, user=_who(user), now=now)
        if change is not None:
            engine_config_push_on_commit(market_id=market.pk)
    market.wait_bound_mode, market.wait_bound_s = locked.wait_bound_mode, locked.wait_bound_s
    return change


def _pinned(wait_bound_s: object) -> float:
    """A pinned wait bound, seconds: in the mechanism's range, 0 (off) excluded."""
    try:
        new = wait_bound_checked(wait_bound_s)
    except ValueError:
        new = 0.0
    if new == 0:
        raise ValueError(
            f"a pinned wait bound is {WAIT_BOUND_MIN_S:g}..{WAIT_BOUND_MAX_S:g} seconds (to turn "
            f"it off choose off), got {wait_bound_s!r}"
        )
    return new


def market_reserve_max_set(
    *,
    market: Market,
    reserve_max: Decimal | str | int,
    user: AbstractBaseUser | None,
    now: datetime | None = None,
) -> ControlChange | None:
    """Set ``market``'s reserve ceiling ($/s), the most ``market_reserve_set`` accepts, and
    audit the change (``ControlChange``).

    The ceiling is an amount as a reserve is (ValueError otherwise: at most ``MAX_BID``, 9
    decimals) and not below the reserve in force (ValueError: lower the reserve first). None
    when it already has this value (nothing written). Engines never see it: nothing is pushed.
    """
    new = money_exact(reserve_max)
    if new > Decimal(str(MAX_BID)):
        raise ValueError(f"the ceiling must be at most {MAX_BID:g} $/s: {reserve_max!r}")
    with transaction.atomic():
        locked = Market.objects.select_for_update().get(pk=market.pk)
        if locked.reserve_max == new:
            market.reserve_max = new
            return None
        if new < locked.reserve:
            raise ValueError(
                f"the ceiling {new} $/s is below the reserve in force ({locked.reserve} $/s)"
            )
        change = ControlChange.objects.create(
            market=locked,
            control=ControlChange.Control.RESERVE_MAX,
            changed_by=_who(user),
            old=str(locked.reserve_max),
            new=str(new),
            at=now or timezone.now(),
        )
        Market.objects.filter(pk=market.pk).update(reserve_max=new, updated_at=timezone.now())
    market.reserve_max = new
    return change


def auto_reserve_text(*, enabled: bool, target_s: float) -> str:
    """The automatic reserve's state as its audit row writes it ("off", "on, p90 <= 2 s")."""
    return f"on, p90 <= {target_s:g} s" if enabled else "off"


def _auto_reserve_write(
    locked: Market,
    *,
    enabled: bool,
    target_s: float | None,
    user: AbstractBaseUser | None,
    now: datetime | None,
) -> ControlChange | None:
    """Turn the locked market's automatic reserve on or off (``target_s``: the new target, None:
    keep it) and audit it; None when nothing changes."""
    target = locked.auto_reserve_target_s if target_s is None else target_s
    old = auto_reserve_text(enabled=locked.auto_reserve, target_s=locked.auto_reserve_target_s)
    new = auto_reserve_text(enabled=enabled, target_s=target)
    if (enabled, target) == (locked.auto_reserve, locked.auto_reserve_target_s):
        return None
    Market.objects.filter(pk=locked.pk).update(
        auto_reserve=enabled, auto_reserve_target_s=target, updated_at=timezone.now()
    )
    locked.auto_reserve, locked.auto_reserve_target_s = enabled, target
    if old == new:  # a target moved while off: nothing an operator would read as a change
        return None
    return ControlChange.objects.create(
        market=locked,
        control=ControlChange.Control.AUTO_RESERVE,
        changed_by=_who(user),
        old=old,
        new=new,
        at=now or timezone.now(),
    )


def market_auto_reserve_set(
    *,
    market: Market,
    enabled: bool,
    target_s: float | None = None,
    user: AbstractBaseUser | None,
    now: datetime | None = None,
) -> ControlChange | None:
    """Turn ``market``'s automatic reserve on (toward ``target_s``: seconds of TTFT p90 for the
    requests whose bids buy priority; None: the target it has) or off, audited
    (``ControlChange``). ValueError for a target that is not a number of seconds > 0. None when
    nothing changed. The reserve itself moves at the next step (``market.reserves``)."""
    if target_s is not None and not (isinstance(target_s, int | float) and 0 < target_s < 1e6):
        raise ValueError(f"the target wait must be a number of seconds > 0: {target_s!r}")
    with transaction.atomic():
        locked = Market.objects.select_for_update().get(pk=market.pk)
        change = _auto_reserve_write(
            locked,
            enabled=enabled,
            target_s=None if target_s is None else float(target_s),
            user=user,
            now=now,
        )
    market.auto_reserve, market.auto_reserve_target_s = (
        locked.auto_reserve,
        locked.auto_reserve_target_s,
    )
    return change


def market_alerts_set(
    *,
    market: Market,
    queue: int | None,
    ttft_p99_s: float | None,
    user: AbstractBaseUser | None,
    now: datetime | None = None,
) -> list[ControlChange]:
    """Set the console's alert thresholds of ``market``: more than ``queue`` requests waiting,
    a TTFT p99 above ``ttft_p99_s`` seconds (None: no alert). ValueError for a negative queue or
    a wait that is not > 0. Each change is audited (``ControlChange``); the changes made."""
    if queue is not None and (isinstance(queue, bool) or not isinstance(queue, int) or queue < 0):
        raise ValueError(f"the queue threshold must be a whole number >= 0: {queue!r}")
    if ttft_p99_s is not None and not (
        isinstance(ttft_p99_s, int | float) and 0 < ttft_p99_s < 1e6
    ):
        raise ValueError(f"the TTFT threshold must be a number of seconds > 0: {ttft_p99_s!r}")
    wanted = {
        ControlChange.Control.ALERT_QUEUE: ("alert_queue", queue),
        ControlChange.Control.ALERT_TTFT: (
            "alert_ttft_p99_s",
            None if ttft_p99_s is None else float(ttft_p99_s),
        ),
    }
    changes = []
    with transaction.atomic():
        locked = Market.objects.select_for_update().get(pk=market.pk)
        for control, (field, value) in wanted.items():
            old = getattr(locked, field)
            if old == value:
                continue
            changes.append(
                ControlChange.objects.create(
                    market=locked,
                    control=control,
                    changed_by=_who(user),
                    old="off" if old is None else f"{old:g}",
                    new="off" if value is None else f"{value:g}",
                    at=now or timezone.now(),
                )
            )
            setattr(locked, field, value)
            setattr(market, field, value)
        if changes:
            Market.objects.filter(pk=market.pk).update(
                alert_queue=locked.alert_queue,
                alert_ttft_p99_s=locked.alert_ttft_p99_s,
                updated_at=timezone.now(),
            )
    return changes


def replica_set(
    *, market: Market, engine_id: str, url: str, enabled: bool = True, push: bool = True
) -> Replica:
    """Add the replica ``engine_id`` to ``market`` at ``url``, or move it there (enabled or not).

    ValueError when the id or URL is blank, or the id is another market's. Once committed, the
    market's policy and reserve are pushed to its engines, the new one included (it also reads
    them from the control store when it follows it); ``push=False`` pushes nothing
    (``live_market``: its engines read the control store as they start, and follow it).
    """
    engine_id, url = engine_id.strip(), url.strip().rstrip("/")
    if not engine_id or not url:
        raise ValueError("a replica needs an engine id and a URL")
    with transaction.atomic():
        replica = Replica.objects.select_for_update().filter(engine_id=engine_id).first()
        if replica is not None and replica.market_id != market.pk:
            raise ValueError(f"engine id {engine_id!r} is a replica of another market")
        if replica is None:
            replica = Replica.objects.create(
                market=market, engine_id=engine_id, url=url, enabled=enabled
            )
        elif (replica.url, replica.enabled) != (url, enabled):
            replica.url, replica.enabled = url, enabled
            replica.save(update_fields=["url", "enabled"])
        else:
            return replica
        logger.info(
            "market %s: replica %s at %s %s", market.slug, engine_id, url,
            "enabled" if enabled else "disabled",
        )  # fmt: skip
        if push:
            engine_config_push_on_commit(market_id=market.pk)
    return replica


def engine_config_push_on_commit(*, market_id: int) -> None:
    """Once the surrounding transaction commits, queue the push of the market's policy and
    reserve to its engine (never raises into the caller)."""
    transaction.on_commit(lambda: engine_config_push_enqueue(market_id=market_id))


@dataclass(frozen=True)
class MarketSpec:
    """What a market is created with (prices in dollars per million tokens, as strings)."""

    slug: str
    name: str
    served_model: str
    price_input_per_mtok: str
    price_cached_input_per_mtok: str
    price_output_per_mtok: str
    reserve: str


DEMO_MARKET = MarketSpec(
    slug="demo-llm",
    name="Demo LLM",
    served_model="demo/tiny-llm",
    price_input_per_mtok="0.150000000",
    price_cached_input_per_mtok="0.075000000",
    price_output_per_mtok="0.600000000",
    reserve="0.001000000",
)


def market_ensure(*, spec: MarketSpec) -> Market:
    """The market with ``spec.slug``, created from ``spec`` if missing (an existing one is kept:
    operators may have moved its prices or reserve since)."""
    market, _ = Market.objects.get_or_create(
        slug=spec.slug,
        defaults={
            "name": spec.name,
            "served_model": spec.served_model,
            "price_input_per_mtok": money_exact(spec.price_input_per_mtok),
            "price_cached_input_per_mtok": money_exact(spec.price_cached_input_per_mtok),
            "price_output_per_mtok": money_exact(spec.price_output_per_mtok),
            "reserve": money_exact(spec.reserve),
        },
    )
    return market


def market_demo_seed() -> Market:
    """The demo market ``make run`` starts with. Idempotent."""
    return market_ensure(spec=DEMO_MARKET)
