"""Fixtures: the real ASGI app served by Daphne on a real port, simulated engines, personas.

Daphne runs in a thread of the test process (Twisted's reactor runs once per process, so the
server is session-wide: ``asgi_server`` in ``tests/conftest.py``), so it shares the test
database: tests use the transactional ``db`` (committed rows, seen by the server's threads), and
the gateway's database threads are closed before the test database is dropped. The simulated
engine runs in real time in its own thread (``ServerThread``), sped up.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal

import pytest

from engines.sim.background import ServerThread
from market.models import Market
from openai_api.gateway.keys import api_key_cache_clear
from openai_api.gateway.selectors import caches_clear
from tests.conftest import DaphneThread, StartSim
from tests.personas import Program, program_create


@pytest.fixture(scope="session")
def gateway(asgi_server: DaphneThread) -> DaphneThread:
    """The running ASGI server (one per test session, shared with the browser tests)."""
    return asgi_server


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    caches_clear()
    api_key_cache_clear()
    yield
    caches_clear()
    api_key_cache_clear()


@pytest.fixture
def sim(start_sim: StartSim) -> ServerThread:
    return start_sim()


def market_create(*, engine_url: str, reserve: str = "0", slug: str | None = None) -> Market:
    """$3 per million uncached input tokens, $0.30 cached, $15 output; 60 s wait bound."""
    slug = slug or f"m-{uuid.uuid4().hex[:8]}"
    return Market.objects.create(
        slug=slug,
        name=f"Market {slug}",
        served_model=f"org/{slug}",
        price_input_per_mtok=Decimal("3"),
        price_cached_input_per_mtok=Decimal("0.3"),
        price_output_per_mtok=Decimal("15"),
        reserve=Decimal(reserve),
        engine_url=engine_url,
        max_wait_s=60.0,
    )


@pytest.fixture
def acme(transactional_db) -> Program:
    return program_create("acme")


@pytest.fixture
def market(transactional_db, sim: ServerThread) -> Market:
    return market_create(engine_url=sim.url)
