"""Round records from a JSONL file to the live consoles: the embedded mode, with no Redis.

The simulated engine appends one record per line (``--rounds-jsonl PATH``). The follower reads
complete lines from a byte offset, checks each and then saves the offset just past it in a small
state file (``PATH.offset``, JSON, replaced atomically), so a restart resumes where it stopped.
Round records move no money (``scheduler_bridge.settlement.stream``). A line that is not a valid
record is appended to ``PATH.dead`` with its error and skipped. A file that shrinks or is
replaced (another inode) is read again from its start. Records are published to the consoles
(``market.live.publisher``), as by the Redis consumer.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engines.contract.records import RoundRecord, round_record_loads
from market.live.publisher import RoundsPublisher, default_publisher
from scheduler_bridge.settlement.stream import ConsumeStats

logger = logging.getLogger(__name__)

POLL_S = 0.2  # how often a follower looks for new lines, wall seconds


@dataclass(frozen=True)
class Position:
    """Where the follower is: the next unread byte of the file with this inode."""

    offset: int = 0
    inode: int | None = None


def position_load(state_path: Path) -> Position:
    """The saved position, or the file's start when there is none (or it is unreadable)."""
    try:
        data = json.loads(state_path.read_text())
        return Position(offset=int(data["offset"]), inode=data.get("inode"))
    except FileNotFoundError:
        return Position()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("rounds: unreadable state %s (%s); reading from the start", state_path, exc)
        return Position()


def position_save(state_path: Path, position: Position) -> None:
    """Write the position atomically (a crash leaves the old one or the new one)."""
    tmp = state_path.with_name(state_path.name + ".tmp")
    tmp.write_text(json.dumps({"offset": position.offset, "inode": position.inode}))
    os.replace(tmp, state_path)


def rounds_jsonl_follow(
    *,
    path: Path,
    state_path: Path | None = None,
    dead_path: Path | None = None,
    follow: bool = False,
    poll_s: float = POLL_S,
    should_stop: Callable[[], bool] = lambda: False,
    publisher: RoundsPublisher | None = None,
) -> ConsumeStats:
    """Take every complete line after the saved offset; with ``follow``, keep waiting for
    more until ``should_stop()`` (checked every ``poll_s`` seconds when idle).

    Without ``follow`` it returns at the end of the file. The file may not exist yet. Records
    taken go live through ``publisher`` (this process's by default).
    """
    publisher = publisher or default_publisher()
    path = Path(path)
    state_path = state_path or path.with_name(path.name + ".offset")
    dead_path = dead_path or path.with_name(path.name + ".dead")
    stats = ConsumeStats()
    position = position_load(state_path)
    while not should_stop():
        position, progressed = _read_available(
            path=path,
            position=position,
            state_path=state_path,
            dead_path=dead_path,
            stats=stats,
            publisher=publisher,
        )
        if not follow and not progressed:
            break
        if not progressed:
            publisher.tick()  # a throttled book's turn may have come
            time.sleep(poll_s)
    publisher.flush()
    return stats


def _read_available(
    *,
    path: Path,
    position: Position,
    state_path: Path,
    dead_path: Path,
    stats: ConsumeStats,
    publisher: RoundsPublisher,
) -> tuple[Position, bool]:
    """Take the complete lines there are now; returns the new position and whether any were."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return position, False
    with handle:
        st = os.fstat(handle.fileno())
        replaced = position.inode is not None and st.st_ino != position.inode
        if replaced or st.st_size < position.offset:
            logger.warning("rounds: %s was replaced or truncated; reading it from the start", path)
            position = Position(offset=0, inode=st.st_ino)
        elif position.inode is None:
            position = Position(offset=position.offset, inode=st.st_ino)
        handle.seek(position.offset)
        progressed = False
        while line := handle.readline():
            if not line.endswith(b"\n"):
                break  # the engine is still writing it: read it whole next time
            where = f"{path}@{position.offset}"
            record = _line_taken(line=line, where=where, dead_path=dead_path, stats=stats)
            position = Position(offset=position.offset + len(line), inode=st.st_ino)
            position_save(state_path, position)
            stats.read += 1
            progressed = True
            if record is not None:
                publisher.settled(record)
    return position, progressed


def _line_taken(
    *, line: bytes, where: str, dead_path: Path, stats: ConsumeStats
) -> RoundRecord | None:
    """Take one line (or dead-letter it): the record, None when there was none (blank,
    dead-lettered)."""
    if not line.strip():
        return None
    try:
        record = round_record_loads(line)
    except ValueError as exc:  # malformed
        _dead_letter(line=line, where=where, error=f"ValueError: {exc}", dead_path=dead_path)
        stats.dead += 1
        return None
    stats.add_taken(record)
    return record


def _dead_letter(*, line: bytes, where: str, error: str, dead_path: Path) -> None:
    """Append ``{"at", "error", "line"}`` to the dead-letter file (one JSON object a line)."""
    logger.error("rounds: dead-lettering line %s: %s", where, error)
    text = line.rstrip(b"\n").decode("utf-8", errors="replace")
    with dead_path.open("a", encoding="utf-8") as dead:
        dead.write(json.dumps({"at": where, "error": error, "line": text}) + "\n")
