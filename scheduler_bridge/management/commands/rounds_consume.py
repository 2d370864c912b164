"""``manage.py rounds_consume``: take round records in the foreground until Ctrl-C.

    manage.py rounds_consume [--stream NAME] [--group NAME] [--once]

The same loop as the Celery task ``scheduler_bridge.rounds_consume``
(``scheduler_bridge.settlement.stream``), as one more consumer of the group: it checks each
record of the Redis stream and publishes it to the live consoles; it moves no money (the gateway
settles each request's charges). Safe to stop and restart at any moment.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler_bridge.settlement import stream as rounds

STATS_EVERY_S = 10.0  # how often the Redis loop prints what it did, wall seconds
IDLE_RETRY_S = 1.0  # pause after a call stopped by an outage, seconds
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Command(BaseCommand):
    help = (
        "Take round records from the Redis stream and publish them to the live consoles (they "
        "move no money)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--stream", help="Redis stream (default: the ROUNDS_STREAM setting)")
        parser.add_argument("--group", default=rounds.GROUP, help="consumer group")
        parser.add_argument("--consumer", help="consumer name (default: host:pid)")
        parser.add_argument(
            "--claim-min-idle-ms",
            type=int,
            default=rounds.CLAIM_MIN_IDLE_MS,
            help="take over other consumers' entries pending this long (milliseconds)",
        )
        parser.add_argument(
            "--once", action="store_true", help="stop when there is nothing left to take"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._stop = False
        # Ctrl-C and SIGTERM finish the record in hand, then stop (previous handlers restored).
        previous = {sig: signal.signal(sig, self._request_stop) for sig in STOP_SIGNALS}
        try:
            self._stream(options)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop = True

    def _stream(self, options: dict[str, Any]) -> None:
        if not settings.REDIS_URL:
            raise CommandError("REDIS_URL is not set")
        sc = rounds.StreamConsumer(
            client=rounds.redis_client(settings.REDIS_URL),
            stream=options["stream"] or settings.ROUNDS_STREAM,
            group=options["group"],
            consumer=options["consumer"] or f"{socket.gethostname()}:{os.getpid()}",
        )
        self.stdout.write(f"taking round records from {sc.stream} as {sc.group}/{sc.consumer}")
        total = rounds.ConsumeStats()
        printed = time.monotonic()
        try:
            while not self._stop:
                stats = rounds.rounds_consume(
                    sc=sc,
                    max_seconds=5.0,
                    claim_min_idle_ms=options["claim_min_idle_ms"],
                    until_idle=options["once"],
                    should_stop=lambda: self._stop,
                )
                total.add(stats)
                if stats.stalled:
                    if options["once"]:
                        raise CommandError(f"stopped: {stats.stalled}")
                    time.sleep(IDLE_RETRY_S)
                elif options["once"] and stats.read == 0:
                    break
                if time.monotonic() - printed >= STATS_EVERY_S:
                    self.stdout.write(_summary(total))
                    printed = time.monotonic()
        finally:
            sc.client.close()
        self.stdout.write(_summary(total))


def _summary(stats: rounds.ConsumeStats) -> str:
    """One line: records handled, and the admitted requests in those taken."""
    return (
        f"records: {stats.read} read, {stats.taken} taken, {stats.reclaimed} reclaimed, "
        f"{stats.dead} dead-lettered, {stats.failed} failed, {stats.trimmed} trimmed; "
        f"{stats.admitted} admitted requests"
    )
