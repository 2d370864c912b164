"""Tell a market's engines its ordering policy, reserve price and wait bound when an operator
changes them.

``market.services`` enqueues ``market.tasks.engine_config_push_enqueue`` with
``transaction.on_commit``; the Celery task ``market.engine_config_push`` then, with
the market as it is when the task runs:

1. writes the market's control state to the control store (``engines.contract.control``:
   the market's Redis key). Engines that follow the store read it within their poll interval, and a
   replica that starts or restarts reads it first: the SGLang plugin does, since SGLang has no
   route for the market's control;
2. sends ``{"policy", "reserve", "wait_bound_s"}`` to the control path
   (``engines.contract.wire``: ``POST <url>/admin/market``, applied from its next round;
   ``Authorization: Bearer ENGINE_ADMIN_TOKEN`` when that setting is set) of every engine of
   the market (``control_targets``: each enabled replica; a market without replicas, its entry
   point),
   through the one engine client. An engine that answers 404 there has no such route (SGLang):
   it follows the store, and the push counts as published, not refused. An engine that cannot
   be reached is retried on its own (``url``), so that one replica away neither holds back nor
   repeats the others.

Both steps send the latest values, so pushes that overtake each other or run twice still leave
the engines with what the database says. A store that cannot be written is retried like an
engine that is away.

The periodic tick (``market.live.periodic``, every second) writes the store back when it is
found stale (:func:`control_stale`: nothing there, a state no engine can use, or one written
before the market's last change, ``Market.updated_at``): after Redis lost its data, or a push
that never ran. An engine following the store then runs the market's values again within its
poll, a value pushed to its own control path meanwhile included (:func:`controls_refresh`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from django.conf import settings

from engines.client import EngineRejected, EngineUnavailable, engine_client
from engines.contract.control import (
    ControlState,
    RedisControlStore,
    control_loads,
    control_texts,
    now_state,
)
from engines.contract.wire import ControlError
from market.models import Market

logger = logging.getLogger(__name__)

TIMEOUT_S = 2.0  # connect and read, seconds
RETRY_BASE_S = 1.0  # the first retry's delay; each next one doubles, seconds
RETRY_MAX_S = 60.0
MAX_RETRIES = 8  # about 4 minutes of retrying in all

PushOutcome = Literal["pushed", "published", "no-market", "no-engine", "refused"]


class EngineUnreachable(Exception):
    """An engine could not be reached or answered 5xx, or the store could not be written: worth
    retrying. ``urls``: the engines to retry (empty: the store, so everything)."""

    def __init__(self, message: str, urls: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.urls = urls


def retry_delay_s(retries: int) -> float:
    """Seconds before retry number ``retries + 1``: 1, 2, 4, ... capped at ``RETRY_MAX_S``."""
    return min(RETRY_BASE_S * 2**retries, RETRY_MAX_S)


def control_stale(text: bytes | None, market: Market) -> bool:
    """Whether the text a market's control store holds must be written again: nothing there, a
    state no engine can use, or one written before the market's last change
    (``Market.updated_at``, which each change of its policy, reserve or wait bound sets)."""
    if text is None:
        return True
    try:
        state = control_loads(text)
    except ControlError:
        return True
    return state.written_at < market.updated_at.timestamp()


def control_publish(market: Market, *, if_stale: bool = False) -> bool:
    """Write the market's policy, reserve and wait bound to its control store; whether it wrote.

    ``if_stale``: only when the store's state is stale (:func:`control_stale`) against the
    market as the database has it then, and unless another writer writes the key meanwhile (a
    push of a change made since is newer). Raises :class:`EngineUnreachable` when the store
    cannot be read or written (a retry may help).
    """
    store = RedisControlStore(settings.REDIS_URL, market.slug, timeout_s=TIMEOUT_S)

    def stale_state(text: bytes | None) -> ControlState | None:
        current = Market.objects.filter(pk=market.pk).first()  # read after the key is watched
        return None if current is None or not control_stale(text, current) else _state(current)

    try:
        if if_stale:
            return store.replace(stale_state)
        store.write(_state(market))
        return True
    except Exception as exc:  # redis errors, OSError: worth retrying
        raise EngineUnreachable(f"control store for {market.slug}: {exc}") from exc
    finally:
        store.close()


def _state(market: Market) -> ControlState:
    return now_state(market.policy, float(market.reserve), market.wait_bound_s)


_refresh_failing = False  # the last refresh could not reach the store (logged once)


def controls_refresh(markets: Sequence[Market]) -> list[str]:
    """Write back each of ``markets``' control stores found stale (:func:`control_stale`): one
    read of all the keys, a write only for a stale one. The slugs written; a store that cannot
    be reached is logged (once until it answers again) and left to the next call."""
    global _refresh_failing
    written: list[str] = []
    try:
        texts = control_texts(settings.REDIS_URL, [m.slug for m in markets], timeout_s=TIMEOUT_S)
        for market in markets:
            if control_stale(texts[market.slug], market) and control_publish(market, if_stale=True):
                written.append(market.slug)
    except Exception as exc:  # redis errors, OSError, EngineUnreachable: the next tick retries
        if not _refresh_failing:
            logger.warning("engine config: cannot refresh the control stores: %s", exc)
        _refresh_failing = True
        return written
    _refresh_failing = False
    if written:
        logger.info(
            "engine config: control store written back (missing or older than the market): %s",
            ", ".join(written),
        )
    return written


def control_targets(market: Market) -> list[str]:
    """The base URLs a market's control is pushed to: its enabled replicas; without replicas,
    its entry point (its one engine); none when it has neither."""
    replicas = list(market.replicas.all())
    if replicas:
        return [r.url.strip() for r in replicas if r.enabled and r.url.strip()]
    entry = market.engine_url.strip()
    return [entry] if entry else []


# Outcomes of several engines, the one that says most first.
_OUTCOME_ORDER: tuple[PushOutcome, ...] = ("refused", "published", "pushed")


def engine_config_push(
    *,
    market_id: int,
    url: str | None = None,
    timeout_s: float = TIMEOUT_S,
) -> PushOutcome:
    """Write the market's current policy, reserve ($/s) and wait bound (s) to its control store
    and POST them to its engines (``url``: only that one, if it still is one of them).

    Returns what happened (of several engines: ``refused`` if one refused, else ``published`` if
    one only follows the store, else ``pushed``); raises :class:`EngineUnreachable` naming the
    engines that a retry may reach, after trying every other one. A market without engines is
    only published, with a log line.
    """
    market = Market.objects.filter(pk=market_id).first()
    if market is None:
        logger.warning("engine config: market %s no longer exists; nothing pushed", market_id)
        return "no-market"
    control_publish(market)
    targets = control_targets(market)
    if url is not None:
        targets = [u for u in targets if u == url]
    if not targets:
        logger.info("engine config: market %s has no engine to push to", market.slug)
        return "no-engine"
    outcomes: list[PushOutcome] = []
    unreachable: list[tuple[str, str]] = []
    for target in targets:
        try:
            outcomes.append(_push(market, target, timeout_s=timeout_s))
        except EngineUnavailable as exc:
            unreachable.append((target, exc.message))
    if unreachable:
        raise EngineUnreachable(
            "; ".join(f"{u}: {message}" for u, message in unreachable),
            urls=tuple(u for u, _ in unreachable),
        )
    return next(o for o in _OUTCOME_ORDER if o in outcomes)


def _push(market: Market, base_url: str, *, timeout_s: float) -> PushOutcome:
    """POST the market's control to one engine (EngineUnavailable when it is away)."""
    client = engine_client()
    try:
        client.call_sync(
            lambda: client.control(
                base_url=base_url,
                policy=market.policy,
                reserve=float(market.reserve),
                wait_bound_s=market.wait_bound_s,
                token=settings.ENGINE_ADMIN_TOKEN,
                timeout_s=timeout_s,
            )
        )
    except EngineRejected as exc:
        if exc.status == 404:
            # No control route (SGLang): the engine follows the control store written above.
            logger.info(
                "engine config: market %s: policy %s, reserve %s $/s published to the control "
                "store (%s has no control route)",
                market.slug, market.policy, market.reserve, base_url,
            )  # fmt: skip
            return "published"
        # 401 (wrong token), 400: retrying won't help.
        logger.error(
            "engine config: %s refused policy %s, reserve %s for market %s: %s",
            base_url, market.policy, market.reserve, market.slug, exc.message[:500],
        )  # fmt: skip
        return "refused"
    logger.info(
        "engine config: market %s -> %s: policy %s, reserve %s $/s, wait bound %g s",
        market.slug, base_url, market.policy, market.reserve, market.wait_bound_s,
    )  # fmt: skip
    return "pushed"
