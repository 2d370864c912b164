"""Browser tests: Playwright's Python package driving Debian's Chromium (``/usr/bin/chromium``,
installed by ``.ci/run``; no browser download), against the real ASGI app served by Daphne in
this process (``asgi_server``) and a live market:

- a simulated engine in real time, slowed so a queue forms, writing its round records to a
  Redis stream of the test's own;
- the live publishers, over the Redis channel layer as in production: ``manage.py
  rounds_consume`` (a process of its own, on the test database) takes the round records from
  the stream and publishes them, and the once-a-second tick that celery beat runs
  (``market.live.periodic.live_tick``: engine status from ``/metrics``, token spend) runs in a
  thread;
- a load generator: threads of two tenants' programs sending chat completions with bids
  through the gateway;
- a Celery worker process, as in production: the console's changes reach the engines by its
  push task (``market.tasks.engine_config_push``), sent on a queue of the test's own.

Screenshots go to ``test-results/screenshots/``.
"""

from __future__ import annotations

import os
import random
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import redis
from django.conf import settings

from accounts.models import Role
from accounts.services import api_key_create, budget_set, invoice_generate, month_bounds
from config.celery import app as celery_app
from engines.router import Router, RouterOptions
from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
from market.models import Market
from market.services import replica_set
from openai_api.gateway.keys import api_key_cache_clear
from openai_api.gateway.selectors import caches_clear
from tests.accounts.factories import PASSWORD, tenant_create, user_create
from tests.conftest import ENGINE_ADMIN_TOKEN, REPO_ROOT, DaphneThread, dead_port
from tests.market.live_helpers import LivePublishers
from tests.scheduler_bridge.workers import celery_worker

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SCREENSHOTS = REPO_ROOT / "test-results" / "screenshots"
# A slow engine (1 ms per prefilled token, 768 tokens per step) so requests queue up.
ENGINE_SETTINGS = ("prefill_token_s=1e-3", "max_prefill_tokens=768", "chunked_prefill_size=768")
PROGRAMS = [  # (system prompt, bid $/s, request class): shared prefixes make the subtrees
    ("You are a support agent for a hardware store. " + "Be brief. " * 30, 0.02, "interactive"),
    ("You review code for bugs and style. " + "Explain each finding. " * 40, 0.05, "interactive"),
    ("Summarize the document for executives. " + "Keep numbers exact. " * 60, 0.004, "background"),
    ("You label support tickets with one category. " + "One word. " * 10, 0.001, "background"),
    ("You translate the user's text into French. " + "Keep the format. " * 20, 0.01, "interactive"),
]


@pytest.fixture(scope="module")
def browser(django_db_setup):
    """Headless Chromium (Debian's), one per module.

    Playwright's sync API keeps an event loop running in this thread, which Django takes for an
    async context: DJANGO_ALLOW_ASYNC_UNSAFE lets the tests use the ORM meanwhile (they are
    synchronous; the server runs in its own thread), and only while the browser is open.
    """
    if not CHROMIUM.exists():
        pytest.skip(f"needs {CHROMIUM}: apt-get install chromium (.ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api")
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(30_000)
    yield page
    context.close()


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def login(page, server: DaphneThread, username: str, next_url: str) -> None:
    page.goto(f"{server.url}/accounts/login/?next={next_url}")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("main button[type=submit]")
    page.wait_for_url(f"{server.url}{next_url}")


@dataclass
class LiveMarket:
    server: DaphneThread
    sim: ServerThread
    market: Market
    keys: dict[str, str]
    sent: int = 0
    errors: list[str] = field(default_factory=list)
    replicas: list[ServerThread] = field(default_factory=list)  # a fleet: behind the router


class LoadGenerator:
    """Threads sending chat completions with bids through the gateway until stopped."""

    def __init__(self, live: LiveMarket, threads: int = 32) -> None:
        self.live = live
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)
        ]
        self._lock = threading.Lock()

    def start(self) -> LoadGenerator:
        for thread in self._threads:
            thread.start()
        return self

    def _run(self, i: int) -> None:
        rnd = random.Random(i)
        tenants = sorted(self.live.keys)
        with httpx.Client(base_url=self.live.server.url, timeout=60) as client:
            while not self._stop.is_set():
                tenant = tenants[i % len(tenants)]
                prompt, bid, request_class = rnd.choice(PROGRAMS)
                body = {
                    "model": self.live.market.served_model,
                    "max_tokens": rnd.randint(8, 24),
                    "messages": [
                        {"role": "system", "content": prompt},
                        {"role": "user", "content": f"Case {rnd.random()}: " + "w " * 20},
                    ],
                    "bid": f"{bid * rnd.uniform(0.5, 1.5):.6f}",
                    "request_class": request_class,
                }
                headers = {"Authorization": f"Bearer {self.live.keys[tenant]}"}
                try:
                    response = client.post("/v1/chat/completions", json=body, headers=headers)
                except httpx.HTTPError as exc:
                    response = None
                    error = f"{type(exc).__name__}: {exc}"
                else:
                    error = "" if response.status_code == 200 else response.text[:200]
                with self._lock:
                    self.live.sent += 1
                    if error:
                        self.live.errors.append(error)
                if response is None:
                    self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=70)


@pytest.fixture
def live_market(asgi_server, transactional_db, tmp_path) -> Iterator[LiveMarket]:
    """A market with a real engine, two tenants (acme, globex) with members and an operator,
    the live publishers, and load from both tenants' programs."""
    with site_worker(tmp_path), _live(asgi_server, tmp_path, replicas=1) as live:
        yield live


@pytest.fixture
def live_fleet(asgi_server, transactional_db, tmp_path) -> Iterator[LiveMarket]:
    """The same market served by two replicas behind SGLang's real model gateway (its entry point),
    each writing its own round records."""
    with site_worker(tmp_path), _live(asgi_server, tmp_path, replicas=2) as live:
        yield live


@pytest.fixture
def quiet_market(asgi_server, transactional_db, tmp_path) -> Iterator[LiveMarket]:
    """The live market without the load generator: a test sends each request itself."""
    with site_worker(tmp_path), _live(asgi_server, tmp_path, replicas=1, agents=False) as live:
        yield live


@contextmanager
def site_worker(tmp_path: Path) -> Iterator[None]:
    """A Celery worker process on the test database, as production runs one: what the site
    queues (the console's pushes to the engines) goes to a queue of its own, which it takes."""
    with celery_worker(tmp_path) as worker:
        default_queue = celery_app.conf.task_default_queue
        celery_app.conf.task_default_queue = worker.queue
        try:
            yield
        finally:
            celery_app.conf.task_default_queue = default_queue


@contextmanager
def _live(
    asgi_server, tmp_path: Path, *, replicas: int, agents: bool = True
) -> Iterator[LiveMarket]:
    caches_clear()
    api_key_cache_clear()
    slug = f"live-{uuid.uuid4().hex[:8]}"
    stream = f"imtest:rounds:{slug}"
    sims = [
        ServerThread(
            ServerOptions.of(
                port=0, speed=1.0, market=slug, redis_url=settings.REDIS_URL,
                rounds_stream=stream, settings=ENGINE_SETTINGS,
                engine_id=None if replicas == 1 else f"{slug}-r{i + 1}",
                admin_token=ENGINE_ADMIN_TOKEN,  # the market's pushes send it
            )
        ).start()
        for i in range(replicas)
    ]  # fmt: skip
    router = None
    if replicas > 1:
        options = RouterOptions(port=dead_port(), worker_urls=tuple(s.url for s in sims))
        router = Router(options).start()
    market = browser_market_create(
        slug, "Live LLM", engine_url=router.url if router is not None else sims[0].url
    )
    if router is not None:
        for i, sim in enumerate(sims):
            replica_set(market=market, engine_id=f"{slug}-r{i + 1}", url=sim.url)
    keys = {}
    start, end = month_bounds(year=2026, month=1)
    for name in ["acme", "globex"]:
        tenant = tenant_create(name)
        budget_set(tenant=tenant, limit="50", period="month")
        keys[name] = api_key_create(tenant=tenant, name="agents", created_by=None)[1]
        user_create(f"{name}_admin", tenant=tenant, role=Role.ADMIN)
        invoice_generate(tenant=tenant, period_start=start, period_end=end)
    user_create("operator", staff=True)
    live = LiveMarket(
        server=asgi_server, sim=sims[0], market=market, keys=keys,
        replicas=sims if router is not None else [],
    )  # fmt: skip
    publishers = LivePublishers(stream, tmp_path / "rounds_consume.log")
    load = LoadGenerator(live).start() if agents else None
    try:
        yield live
    finally:
        if load is not None:
            load.stop()
        publishers.stop()
        redis.Redis.from_url(settings.REDIS_URL).delete(stream, f"{stream}:dead")
        if router is not None:
            router.stop()
        for sim in sims:
            sim.stop()
        caches_clear()
        api_key_cache_clear()


def browser_market_create(slug: str, name: str, **fields: object) -> Market:
    """A market at the demo's prices ($0.15 / $0.075 / $0.60 per million input, cached input
    and output tokens), its engine at a port nothing listens on unless ``fields`` say
    otherwise."""
    prices = {
        "price_input_per_mtok": "0.15",
        "price_cached_input_per_mtok": "0.075",
        "price_output_per_mtok": "0.6",
        "engine_url": f"http://127.0.0.1:{dead_port()}",
    }
    return Market.objects.create(
        slug=slug, name=name, served_model=f"org/{slug}", **{**prices, **fields}
    )


def now_utc() -> datetime:
    return datetime.now(UTC)
