"""A one-line progress bar on stderr, redrawn at most a few times a second."""

from __future__ import annotations

import sys
import time
from typing import TextIO

_WIDTH = 30
_EVERY_S = 0.2


class Progress:
    """Counts requests served against ``total``; silent when disabled."""

    def __init__(self, total: int, *, enabled: bool, stream: TextIO | None = None) -> None:
        self.total = max(total, 1)
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.done = 0
        self.label = ""
        self._start = time.monotonic()
        self._drawn = 0.0

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self._drawn >= _EVERY_S:
            self._drawn = now
            self._draw(now)

    def set_label(self, label: str) -> None:
        self.label = label

    def _draw(self, now: float) -> None:
        share = min(self.done / self.total, 1.0)
        filled = int(share * _WIDTH)
        bar = "#" * filled + "-" * (_WIDTH - filled)
        elapsed = now - self._start
        eta = elapsed * (1 - share) / share if share > 0 else 0.0
        self.stream.write(
            f"\r[{bar}] {share:6.1%}  {elapsed:5.0f}s  eta {eta:4.0f}s  {self.label[:40]:40s}"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
