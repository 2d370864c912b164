"""The demo agents' load (benchmarks.agents): sized to the capacity the agents measure at start,
so the demo's engines are busy without a queue that only grows (issue 48, item 9)."""

from __future__ import annotations

import pytest

from benchmarks import agents


def test_the_session_rate_offers_the_load_times_the_capacity() -> None:
    # By hand: 0.85 x 3.2 requests/s = 2.72 requests/s; a session sends 2 to 6 turns, 4 on
    # average, so 2.72 / 4 = 0.68 sessions/s = 40.8 sessions a minute.
    assert agents.sessions_per_minute(0.85, 3.2) == pytest.approx(40.8)
    # The demo: 60 sessions a minute on engines that serve 3.47 requests/s (as measured
    # on this machine) offered 60 x 4 / 60 = 4 requests/s, 1.15 x capacity: a queue that grows.
    assert 60 * 4 / 60 / 3.47 == pytest.approx(1.153, abs=1e-3)
    assert agents.sessions_per_minute(0.85, 3.47) < 60
