"""This gateway process's instance id and its heartbeat (``accounts.services.gateways``).

The id is made, and first beaten synchronously, at the process's first admission, so that Redis
knows it alive before any request carrying it is committed; a daemon thread then beats every
``gateways.BEAT_S`` seconds for as long as the process lives (a forked child makes its own).
A beat that fails (Redis unreachable) is tried again at the next one; while it fails, the id's
key expires and the market takes the process for lost (see ``accounts.services.gateways``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

import redis

from accounts.services import gateways

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_pid: int | None = None
_instance = ""


def instance_id() -> str:
    """This process's instance id, written in each request it admits (synchronous: the first
    call beats once, on the caller's thread, and starts the heartbeat thread)."""
    if instance_started():
        return _instance
    return _started()


def instance_started() -> bool:
    """Whether this process's instance id is made (and its first beat sent)."""
    return _pid == os.getpid()


def _started() -> str:
    global _pid, _instance
    with _lock:
        if _pid == os.getpid():
            return _instance
        instance = uuid.uuid4().hex
        _beaten(instance)
        thread = threading.Thread(
            target=_beating, args=(instance,), name="gateway-heartbeat", daemon=True
        )
        thread.start()
        _instance, _pid = instance, os.getpid()
        return instance


def _beaten(instance: str, *, failing: bool = False) -> bool:
    """One beat: whether it reached Redis (a failure is logged when ``failing`` was false, a
    recovery when it was true)."""
    try:
        gateways.beat(instance)
    except redis.RedisError as exc:
        if not failing:
            logger.warning("gateway %s: its heartbeat failed (%s)", instance, exc)
        return False
    if failing:
        logger.warning("gateway %s: its heartbeat reaches Redis again", instance)
    return True


def _beating(instance: str) -> None:
    failing = False
    while True:
        time.sleep(gateways.BEAT_S)
        failing = not _beaten(instance, failing=failing)
