"""The control store: a market's policy, reserve and wait bound, kept where every engine of the
market reads them, so an operator's change reaches any engine the same way.

The market writes a ``ControlState`` when an operator changes one of them (and at start): in
Redis, the key ``control_key(market)``; its periodic tick reads every market's key at once
(``control_texts``) and writes back one found missing or older than the market's last change
(``RedisControlStore.replace``, which leaves a state written meanwhile). An
engine follows the store with a ``ControlFollower``: it reads the state once when it starts (so
a replica that starts or restarts runs with the values in effect, not its own defaults), then
every ``poll_s`` seconds in a thread, and the engine applies a change from its next round. Its
round records report the policy and reserve of each round, which is how the console sees the
change take effect.

The SGLang plugin follows the store, since SGLang has no route for the market's control
(``wire.CONTROL_PATH`` answers 404 there); the simulated engine follows it too when started with
``--follow-control``, and keeps its HTTP control path for a direct push; a value pushed there
that differs from the store's lasts until the next poll, which puts the store's back.

A state the engine cannot use (bad JSON, an unknown policy, a negative reserve, a wait bound out
of range) is refused whole and counted; the values in effect stay.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from .wire import CONTROL_FIELDS, ControlError, control_read

log = logging.getLogger(__name__)

SCHEMA = "inference-market/control@1"
CONTROL_KEY_PREFIX = "inference-market:control:"
DEFAULT_POLL_S = 0.5


def control_key(market: str) -> str:
    """The Redis key that holds ``market``'s control state."""
    return f"{CONTROL_KEY_PREFIX}{market}"


@dataclass(frozen=True)
class ControlState:
    """A market's policy, reserve ($/s of waiting) and wait bound (seconds, 0: off), as the
    market last wrote them."""

    policy: str
    reserve: float
    written_at: float = field(default=0.0, compare=False)  # Unix time of the market's write
    wait_bound_s: float = 0.0  # a state written before the bound existed has none: off


def control_dumps(state: ControlState) -> str:
    """The state's JSON text, as the store keeps it."""
    return json.dumps({"schema": SCHEMA, **asdict(state)})


def control_loads(text: str | bytes) -> ControlState:
    """The state in ``text``; ControlError (naming the field) for anything an engine can't use."""
    try:
        doc = json.loads(text)
    except (TypeError, ValueError):
        raise ControlError("the control state is not JSON") from None
    if not isinstance(doc, dict):
        raise ControlError("the control state must be a JSON object")
    if doc.get("schema") != SCHEMA:
        raise ControlError(f"the control state's schema must be {SCHEMA!r}", "schema")
    if "policy" not in doc or "reserve" not in doc:
        raise ControlError("the control state needs a policy and a reserve")
    written_at = doc.get("written_at", 0.0)
    if isinstance(written_at, bool) or not isinstance(written_at, int | float):
        raise ControlError("written_at must be a number", "written_at")
    body = {k: doc[k] for k in CONTROL_FIELDS if k in doc}
    policy, reserve, wait_bound_s = control_read(body, policy="", reserve=0.0)
    return ControlState(policy, reserve, float(written_at), wait_bound_s)


class ControlStore(Protocol):
    """Where a market's control state is kept: ``read`` gives its text (None: nothing yet)."""

    def read(self) -> str | bytes | None: ...

    def write(self, state: ControlState) -> None: ...

    def close(self) -> None: ...


class RedisControlStore:
    """The state in one Redis key (``control_key(market)``)."""

    def __init__(self, url: str, market: str, *, timeout_s: float = 2.0) -> None:
        import redis  # noqa: PLC0415 - only where Redis is used

        self.key = control_key(market)
        self.client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )

    def read(self) -> bytes | None:
        return _as_bytes(self.client.get(self.key))

    def write(self, state: ControlState) -> None:
        self.client.set(self.key, control_dumps(state))

    def replace(self, make: Callable[[bytes | None], ControlState | None]) -> bool:
        """Write ``make(the text stored)`` (None: nothing to write) unless the key changes
        between the read and the write: a state another writer wrote meanwhile stays (a
        transaction on the key, ``WATCH``). Whether it was written."""
        import redis  # noqa: PLC0415 - only where Redis is used

        with self.client.pipeline() as pipe:
            try:
                pipe.watch(self.key)  # type: ignore[no-untyped-call]
                state = make(_as_bytes(pipe.get(self.key)))
                if state is None:
                    return False
                pipe.multi()
                pipe.set(self.key, control_dumps(state))
                pipe.execute()
            except redis.WatchError:
                return False
        return True

    def close(self) -> None:
        self.client.close()


def control_texts(
    url: str, markets: Sequence[str], *, timeout_s: float = 2.0
) -> dict[str, bytes | None]:
    """The text each market's store holds (None: nothing), read at once (one ``MGET``)."""
    import redis  # noqa: PLC0415 - only where Redis is used

    if not markets:
        return {}
    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        values = client.mget([control_key(m) for m in markets])
    finally:
        client.close()
    return {m: _as_bytes(v) for m, v in zip(markets, values, strict=True)}


def _as_bytes(value: object) -> bytes | None:
    return value if isinstance(value, bytes) or value is None else str(value).encode()


class ControlFollower:
    """Follows a control store: ``take()`` gives each new state once, for the next round.

    ``start()`` reads the store at once (in the caller's thread), then every ``poll_s`` seconds
    in a daemon thread. A read that fails (the store is down) or a state that is refused is
    counted and logged once per run of failures; the last good state stays.
    """

    def __init__(
        self,
        store: ControlStore,
        *,
        poll_s: float = DEFAULT_POLL_S,
        accept: Callable[[ControlState], str | None] | None = None,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        if not poll_s > 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s!r}")
        self.store = store
        self.poll_s = poll_s
        # ``accept`` says why an engine cannot run a state (None: it can), e.g. a policy the
        # engine does not run; ``on_refused`` hears of each refusal (the engine's metrics).
        self.accept = accept
        self.on_refused = on_refused
        self._lock = threading.Lock()
        self._seen: ControlState | None = None  # the newest good state read
        self._pending: ControlState | None = None  # read but not yet taken
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self.reads = 0
        self.read_errors = 0
        self.refused = 0
        self.changes = 0

    def poll(self) -> None:
        """Read the store once."""
        try:
            text = self.store.read()
        except Exception as exc:  # noqa: BLE001 - any client error means "not read this time"
            self.read_errors += 1
            self._fail(f"cannot read the control store: {exc}")
            return
        self.reads += 1
        if text is None:
            return
        try:
            state = control_loads(text)
            why = None if self.accept is None else self.accept(state)
            if why is not None:
                raise ControlError(why, "policy")
        except ControlError as exc:
            self.refused += 1
            if self.on_refused is not None:
                self.on_refused()
            self._fail(f"refused the market's control state: {exc}")
            return
        if self._failing:
            log.info("control: the store answers again")
            self._failing = False
        with self._lock:
            if state == self._seen:  # the same values (written_at is not compared)
                return
            self._seen = self._pending = state
            self.changes += 1

    def overridden(self) -> None:
        """The engine's values were set other than from the store (its HTTP control path): the
        next poll gives the store's state again, so the store's values come back."""
        with self._lock:
            self._seen = None

    def take(self) -> ControlState | None:
        """The newest state not yet taken, or None; each state is given once."""
        if self._pending is None:  # the common case, without the lock
            return None
        with self._lock:
            state, self._pending = self._pending, None
        return state

    def start(self) -> ControlFollower:
        self.poll()
        self._thread = threading.Thread(target=self._run, name="market-control", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.store.close()

    def stats(self) -> dict[str, Any]:
        return {
            "reads": self.reads,
            "read_errors": self.read_errors,
            "refused": self.refused,
            "changes": self.changes,
        }

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def _fail(self, message: str) -> None:
        if not self._failing:
            log.warning("control: %s; the values in effect stay", message)
        self._failing = True


def follower_for(
    *,
    market: str,
    redis_url: str | None,
    poll_s: float = DEFAULT_POLL_S,
    accept: Callable[[ControlState], str | None] | None = None,
    on_refused: Callable[[], None] | None = None,
) -> ControlFollower | None:
    """The follower of ``market``'s store in Redis; None without ``redis_url``."""
    if not redis_url:
        return None
    store = RedisControlStore(redis_url, market)
    return ControlFollower(store, poll_s=poll_s, accept=accept, on_refused=on_refused)


def now_state(policy: str, reserve: float, wait_bound_s: float = 0.0) -> ControlState:
    """A state written now."""
    return ControlState(policy, float(reserve), time.time(), float(wait_bound_s))
