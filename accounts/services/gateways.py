"""The gateway processes' heartbeats, and what the market does when one stops beating.

Each gateway process (a uvicorn worker, say) has an **instance id** of its own and writes it in
the row of each request it admits (``Request.gateway``, in the hold's own statement: no extra
round trip). Every :data:`BEAT_S` seconds it **beats** in Redis: its key
``gateways:alive:<id>`` set to expire after :data:`TTL_S` seconds, and its id added to the set
``gateways:instances``, both in one transaction. A process that is killed (SIGKILL, a crash, the
out-of-memory killer, a machine lost) stops beating; :data:`TTL_S` seconds later its key is gone
while its id is still in the set: it is **missing**. A gateway missing in two sweeps at least
:data:`CONFIRM_S` seconds apart is **lost**, and :func:`lost_gateways_sweep` (celery beat, every
:data:`SWEEP_S` seconds) fails its requests still queued, uncharged, their holds released
(``settlement.gateways_lost_sweep``), then forgets it. So a killed gateway's holds are
released 13-20 s after its death (its last heartbeat expires ``TTL_S`` after it beat, a sweep
finds it missing within ``SWEEP_S``, the next one confirms it), not ``STALE_REQUEST_S`` (20
minutes) later; that sweep remains the last resort for anything else.

Why the second look: while Redis is unreachable (a restart that keeps its data, a network cut,
a paused server) nobody beats, and every heartbeat can expire before Redis is back. The first
sweep after it would find every live gateway missing and fail the requests they are serving
(their answers then come back as errors, uncharged). A live gateway beats again within
``BEAT_S`` plus one Redis timeout of Redis's return (4 s), under :data:`CONFIRM_S`, so the second
look finds it alive; a dead one stays missing.

Only an id in the set whose key is gone counts as lost: an id Redis does not know (Redis
restarted without its data, or a gateway that could not reach Redis yet) is left to the stale
sweep, so losing Redis's data fails no request still being served; the gateways add themselves
again at their next beat. A gateway process that cannot reach Redis for ``TTL_S`` seconds while
the sweep can (and :data:`CONFIRM_S` more) is taken for lost: its requests in flight are
failed (uncharged; an answer that comes after is an error, never charged).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import cache

import redis
from django.conf import settings

from accounts.services.settlement import SweepResult, gateways_lost_sweep

logger = logging.getLogger(__name__)

BEAT_S = 2.0  # a gateway process beats this often, seconds
TTL_S = 10.0  # its heartbeat lasts this long, seconds: five beats missed and it is lost
SWEEP_S = 5.0  # the lost gateways' sweep runs this often, seconds (CELERY_BEAT_SCHEDULE)
REDIS_TIMEOUT_S = 2.0
# Missing this long (seen by two sweeps) before lost: more than a live gateway needs to beat
# again once Redis is back (BEAT_S + REDIS_TIMEOUT_S).
CONFIRM_S = BEAT_S + REDIS_TIMEOUT_S + 0.5
INSTANCES_KEY = "gateways:instances"
ALIVE_KEY = "gateways:alive:"
MISSING_KEY = "gateways:missing"  # hash: instance id -> when a sweep first found it missing


@cache
def redis_client(url: str) -> redis.Redis:
    """A client of the Redis at ``url`` (one per process and URL; it pools its connections)."""
    return redis.Redis.from_url(
        url, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S
    )


def beat(instance: str, *, client: redis.Redis | None = None) -> None:
    """One heartbeat of the gateway process ``instance``: alive for :data:`TTL_S` seconds more,
    and known. RedisError when Redis cannot be reached."""
    client = client or redis_client(settings.REDIS_URL)
    with client.pipeline(transaction=True) as pipe:
        pipe.set(ALIVE_KEY + instance, b"1", px=int(TTL_S * 1000))
        pipe.sadd(INSTANCES_KEY, instance)
        pipe.execute()


def lost_gateways(*, client: redis.Redis | None = None) -> list[str]:
    """The instance ids of the gateway processes known to have beaten whose heartbeat has been
    gone since a sweep at least :data:`CONFIRM_S` seconds ago (on Redis's clock). Records the
    newly missing ones and forgets those that beat again."""
    client = client or redis_client(settings.REDIS_URL)
    known = sorted(m.decode() for m in client.smembers(INSTANCES_KEY))
    if not known:
        return []
    alive = client.mget([ALIVE_KEY + instance for instance in known])
    missing = {i for i, beating in zip(known, alive, strict=True) if beating is None}
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    since = {k.decode(): float(v) for k, v in client.hgetall(MISSING_KEY).items()}
    with client.pipeline(transaction=True) as pipe:
        if back := [i for i in since if i not in missing]:
            pipe.hdel(MISSING_KEY, *back)
        if new := {i: now for i in missing if i not in since}:
            pipe.hset(MISSING_KEY, mapping=new)
        pipe.execute()
    return sorted(i for i in missing if i in since and now - since[i] >= CONFIRM_S)


def forgotten(instances: Sequence[str], *, client: redis.Redis | None = None) -> None:
    """Forget lost gateway processes once their requests are closed."""
    if instances:
        client = client or redis_client(settings.REDIS_URL)
        with client.pipeline(transaction=True) as pipe:
            pipe.srem(INSTANCES_KEY, *instances)
            pipe.hdel(MISSING_KEY, *instances)
            pipe.execute()


def lost_gateways_sweep(*, client: redis.Redis | None = None) -> SweepResult:
    """Fail, uncharged, the requests still queued of every lost gateway process, then forget
    those processes (celery beat: every :data:`SWEEP_S` seconds). One Redis round trip or two
    and nothing else while every gateway beats; nothing done while Redis cannot be reached (the
    stale sweep still runs)."""
    try:
        lost = lost_gateways(client=client)
    except redis.RedisError as exc:
        logger.warning("lost gateways sweep: Redis cannot be reached (%s): skipped", exc)
        return SweepResult()
    if not lost:
        return SweepResult()
    result = gateways_lost_sweep(gateways=lost)
    try:
        forgotten(lost, client=client)
    except redis.RedisError as exc:  # swept again next time: nothing is left queued by then
        logger.warning("lost gateways sweep: could not forget %d gateways (%s)", len(lost), exc)
    return result
