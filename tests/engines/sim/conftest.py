"""Fixtures: simulated-engine servers on real TCP ports, in background threads."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
from tests.conftest import SPEED, StartSim

StartServer = StartSim


@pytest.fixture
def start_server(start_sim: StartSim) -> StartSim:
    """Start a server with the given ServerOptions fields (port 0: a free port); stopped after."""
    return start_sim


@pytest.fixture(scope="module")
def shared_server() -> Iterator[ServerThread]:
    """One default server for tests that do not care what ran before them."""
    with ServerThread(ServerOptions.of(port=0, speed=SPEED)) as sim:
        yield sim


def metric_values(text: str) -> dict[str, float]:
    """Samples of a Prometheus exposition by name (labels dropped; ours have one series each)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if "le" in sample.labels:
                key += f"[le={sample.labels['le']}]"
            values[key] = sample.value
    return values
