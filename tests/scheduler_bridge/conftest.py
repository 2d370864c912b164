"""Fixtures shared by the engine's and the gateway's tests: simulated engines on real ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from scheduler_bridge.sim.background import ServerThread
from scheduler_bridge.sim.server import ServerOptions

# Steps take 1/SPEED of their modelled time; reported times stay in engine seconds.
SPEED = 20.0

StartSim = Callable[..., ServerThread]


@pytest.fixture
def start_sim() -> Iterator[StartSim]:
    """Start a simulated engine in a background thread with the given ServerOptions fields
    (port 0: a free port; speed SPEED unless given); stopped after the test."""
    started: list[ServerThread] = []

    def start(**fields) -> ServerThread:
        fields.setdefault("port", 0)
        fields.setdefault("speed", SPEED)
        fields["settings"] = tuple(fields.get("settings", ()))
        sim = ServerThread(ServerOptions(**fields)).start()
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()
