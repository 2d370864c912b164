"""Celery tasks. Thin wrappers: the work belongs in services."""

import os
import socket
from typing import TypedDict

from celery import Task, shared_task


class PingResult(TypedDict):
    """Who ran a :func:`ping`."""

    pong: bool
    worker: str  # the worker's node name (e.g. "celery@host"); the host name when eager
    pid: int  # process id of the worker that ran the task


@shared_task(bind=True, name="scheduler_bridge.ping")
def ping(self: Task) -> PingResult:
    """Answer with the worker's name and pid: proves a task crossed the broker to a worker."""
    return {
        "pong": True,
        "worker": self.request.hostname or socket.gethostname(),
        "pid": os.getpid(),
    }
