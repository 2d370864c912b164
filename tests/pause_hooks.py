"""Pause points for the tests that kill a worker (or cancel a batch) at a precise moment,
registered through the hooks production code offers (``stream.AFTER_TAKE``,
``batches.run.BEFORE_FORWARD``): in this process by the tests themselves, in a Celery worker
this suite starts (``tests.scheduler_bridge.workers.celery_worker``, which makes the worker
import this module) from the environment variables below."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from openai_api.batches import run as batches_run
from scheduler_bridge.settlement import stream

# While the file named exists, the worker waits after each record was checked and before it is
# published and its entry acknowledged; as it starts waiting it creates ``<file>.reached``
# (:func:`rounds_pause_reached`), so that a test knows where the worker is.
ROUNDS_PAUSE_FILE_ENV = "TEST_ROUNDS_PAUSE_FILE"
# While the file named exists, items admitted after the first N (N read from the file) wait
# before they are sent to the engine.
BATCH_PAUSE_FILE_ENV = "TEST_BATCH_PAUSE_FILE"
PAUSE_MAX_S = 120.0


def rounds_pause_reached(path: Path) -> Path:
    """The file a worker paused by the pause file ``path`` creates when it starts waiting."""
    return path.with_name(path.name + ".reached")


def rounds_pause(path: Path) -> Callable[[], None]:
    def pause() -> None:
        if not path.exists():
            return
        rounds_pause_reached(path).touch()
        deadline = time.monotonic() + PAUSE_MAX_S
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    return pause


def batch_pause(path: Path) -> Callable[[], Awaitable[None]]:
    admitted = 0

    async def pause() -> None:
        nonlocal admitted
        admitted += 1
        try:
            let_through = int(path.read_text().strip() or 0)
        except (OSError, ValueError):
            return
        if admitted <= let_through:
            return
        deadline = time.monotonic() + PAUSE_MAX_S
        while path.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    return pause


def register_from_env(environ: Mapping[str, str]) -> None:
    if environ.get(ROUNDS_PAUSE_FILE_ENV):
        stream.AFTER_TAKE.append(rounds_pause(Path(environ[ROUNDS_PAUSE_FILE_ENV])))
    if environ.get(BATCH_PAUSE_FILE_ENV):
        batches_run.BEFORE_FORWARD.append(batch_pause(Path(environ[BATCH_PAUSE_FILE_ENV])))


# Imported by a worker this suite started: register what its environment asks for.
if os.environ.get("TEST_PAUSE_HOOKS") == "1":
    register_from_env(os.environ)
