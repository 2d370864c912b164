"""The live publishers inside the web server's process: the embedded mode (no Redis).

Without Redis the channel layer is in memory: only consumers of the same process, on the same
event loop, receive what is sent. So the web process itself must publish:

    services = live_services_start(loop=daphne_loop, rounds_jsonl=Path("rounds.jsonl"))
    ...
    services.stop()

starts daemon threads: a JSONL follower per engine's file (``scheduler_bridge.settlement.jsonl``:
takes the engine's round records, which move no money, and publishes books, round results and
spend ticks) and the periodic publisher (``market.live.periodic.live_tick`` every
``interval_s``: engine status, spend of token charges). Their messages are handed to ``loop``,
the loop that serves the websockets (``market.live.send.home_loop_set``). ``manage.py
live_serve`` runs Daphne with both.

With Redis none of this is needed (Celery beat runs ``rounds_consume`` and ``live_publish``
every second), though it works there too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from django.db import close_old_connections, connections

from market.live.periodic import live_tick
from market.live.publisher import default_publisher
from market.live.send import home_loop_set
from scheduler_bridge.settlement.jsonl import rounds_jsonl_follow

logger = logging.getLogger(__name__)

INTERVAL_S = 1.0  # seconds between two periodic ticks


class LiveServices:
    """The follower and the periodic publisher, as daemon threads of this process."""

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop | None,
        rounds_jsonl: Path | Sequence[Path] | None = None,
        interval_s: float = INTERVAL_S,
        periodic: bool = True,
    ) -> None:
        self.loop = loop
        # One file per engine (the replicas of a market each write their own).
        if rounds_jsonl is None:
            rounds_jsonl = []
        elif isinstance(rounds_jsonl, str | Path):
            rounds_jsonl = [rounds_jsonl]
        self.rounds_jsonl = [Path(p) for p in rounds_jsonl]
        self.interval_s = interval_s
        self.periodic = periodic
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> LiveServices:
        """Start the threads (sends go to ``self.loop`` from now on)."""
        if self.loop is not None:
            home_loop_set(self.loop)
        for i, path in enumerate(self.rounds_jsonl):
            self._spawn(f"live-rounds-jsonl-{i}", lambda path=path: self._follow(path))
        if self.periodic:
            self._spawn("live-periodic", self._tick_loop)
        return self

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=self._run, args=(target,), name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _run(self, target: Callable[[], None]) -> None:
        try:
            target()
        except Exception:
            logger.exception("live: %s stopped", threading.current_thread().name)
        finally:
            connections.close_all()

    def _follow(self, path: Path) -> None:
        logger.info("live: publishing round records from %s", path)
        rounds_jsonl_follow(
            path=path,
            follow=True,
            should_stop=self._stop.is_set,
            publisher=default_publisher(),
        )

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                close_old_connections()
                live_tick()
            except Exception:
                logger.exception("live: periodic tick failed")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the threads and wait for them; sends go to the callers' loops again."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        self._threads.clear()
        home_loop_set(None)


def live_services_start(
    *,
    loop: asyncio.AbstractEventLoop | None,
    rounds_jsonl: Path | Sequence[Path] | None = None,
    interval_s: float = INTERVAL_S,
    periodic: bool = True,
) -> LiveServices:
    """Start the live publishers in this process (see the module's docstring)."""
    return LiveServices(
        loop=loop, rounds_jsonl=rounds_jsonl, interval_s=interval_s, periodic=periodic
    ).start()
