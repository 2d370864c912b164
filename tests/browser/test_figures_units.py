"""Issue 48, item 5: units and precision on the live pages, at 1024, 1440 and 1920 px.

What the issue saw, and what is checked here:

- the dashboard's request table headed "TTFT S" and "TIME SAVED S" over cells such as "210 ms":
  a header that names a unit names the unit of every cell under it;
- the what-if chart's axes mixing "600µ" and "−0.0005" (Plotly's own format): every tick of
  the console's and the dashboard's value axes is written by the one rule (numbers.js, the
  browser's copy of accounts/figures.py), as ``numbers.figure`` writes the tick's value;
- the reserve card's ``0.005239381 $/s`` beside three-significant-digit figures: the card
  says ``0.00524 $/s`` and keeps every digit in its title;
- the spend chart's "now" label on top of its legend: their boxes do not meet;
- the per-replica counts in the book clipped ("sim-1: 23 · sim-2:"): each replica's count is
  whole inside its cell;
- the book's round number going backwards (152, then 117) as replicas report in turn: the
  book names each replica's latest round.

The book comes through the publisher's own code (``market.live.book.book_publish``, two
replicas' records in turn), the what-if from queues a simulated engine recorded
(``market.live.whatif.whatif_keep``), the dashboard's requests from the tenant's request rows.
No page scrolls sideways. Screenshots: test-results/screenshots/ ``figures-console-<width>.png``,
``figures-book-<width>.png``, ``figures-dashboard-<width>.png``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.cache import cache

from accounts.models import Request, Role
from accounts.services import budget_set
from engines.contract.knobs import MarketKnobs
from engines.contract.records import round_record_dumps, round_record_loads
from engines.sim import Engine, EngineConfig
from engines.sim.driver import ArrivalQueue, run_virtual
from market.live import whatif
from market.live.book import book_publish, book_rows, state_key
from market.models import Market
from tests.accounts.factories import tenant_create, user_create
from tests.browser.conftest import SCREENSHOTS, browser_market_create, login
from tests.engines.contract.test_whatif_record import workload
from tests.market.live_helpers import record, subtree

pytestmark = pytest.mark.browser

WIDTHS = (1024, 1440, 1920)
SLUG = "figures-llm"
RESERVE = Decimal("0.005239381")  # $/s, as the automatic reserve writes them
# Replica ids as long as a fleet's (the browser tests' are "live-<8 hex>-r<i>").
ENGINES = ("live-5f3a9c1e-r1", "live-5f3a9c1e-r2")

# Every tick of the charts' value axes: its value and its text (Plotly's rendered ticks).
TICKS = """(ids) => ids.flatMap((id) => {
    const gd = document.getElementById(id);
    if (!gd || !gd._fullLayout) return [];
    return Object.keys(gd._fullLayout).filter((k) => /^[xy]axis\\d*$/.test(k))
        .filter((k) => gd._fullLayout[k].type === 'linear')
        .flatMap((k) => (gd._fullLayout[k]._vals || []).map((v) => ({
            chart: id, axis: k, value: v.x, text: v.text,
            rule: v.text.endsWith('%') ? numbers.percent(v.x) : numbers.figure(v.x)})));
})"""

# A header that names a unit ("TTFT s", "Bid $/s") against the cells under it.
UNIT_MISMATCHES = """(id) => {
    const table = document.getElementById(id);
    const heads = [...table.querySelectorAll('thead th')].map((th) =>
        th.childNodes[0].textContent.trim());
    const unit = (text) => (text.match(/ (ms|s|\\$\\/s|\\$)$/) || [])[1];
    const bad = [];
    for (const tr of table.querySelectorAll('tbody tr')) {
        [...tr.children].forEach((td, i) => {
            const named = unit(heads[i] || '');
            const text = td.childNodes[0] ? td.childNodes[0].textContent.trim() : '';
            if (!named || text === '—' || text === '') return;
            const ok = named === '$' ? text.startsWith('$') : text.endsWith(` ${named}`);
            if (!ok) bad.push(`${heads[i]}: ${text}`);
        });
    }
    return bad;
}"""

# Each replica's count in the book's cells, against its cell's box.
REPLICAS_CUT = """() => [...document.querySelectorAll('#book .replicas-held .held')]
    .filter((span) => {
        const cell = span.closest('td').getBoundingClientRect();
        const box = span.getBoundingClientRect();
        return box.right > cell.right + 0.5 || box.left < cell.left - 0.5 || box.width === 0;
    }).map((span) => span.textContent)"""

# The spend chart's "now" label and its legend: do their boxes meet?
NOW_ON_LEGEND = """() => {
    const chart = document.getElementById('chart-pacing');
    const now = [...chart.querySelectorAll('.annotation')].find((a) => a.textContent === 'now');
    const legend = chart.querySelector('.legend');
    if (!now || !legend) return null;
    const a = now.getBoundingClientRect(), b = legend.getBoundingClientRect();
    const apart = a.right <= b.left || b.right <= a.left || a.bottom <= b.top || b.bottom <= a.top;
    const meet = !apart;
    return meet ? `now ${JSON.stringify(a)} legend ${JSON.stringify(b)}` : null;
}"""


def page_width(page) -> tuple[int, int]:
    return tuple(page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]"))


def wrong_ticks(page, ids: list[str]) -> tuple[list[dict], list[dict]]:
    ticks = page.evaluate(TICKS, ids)
    return ticks, [t for t in ticks if t["text"] != t["rule"]]


def view_shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


@pytest.fixture
def market(asgi_server, transactional_db) -> Market:
    market = browser_market_create(SLUG, "Figures LLM", reserve=RESERVE)
    user_create("operator", staff=True)
    whatif.whatif_clear(SLUG)
    cache.delete(state_key(SLUG))
    yield market
    whatif.whatif_clear(SLUG)
    cache.delete(state_key(SLUG))


def queues_keep() -> int:
    """A simulated engine's rounds (at a small reserve, so the what-if's figures are in the
    millionths of a dollar), each kept for the what-if as if 10 s after the one before."""
    config = EngineConfig(prefill_token_s=1e-3, max_prefill_tokens=256, chunked_prefill_size=256)
    knobs = MarketKnobs(market=SLUG, reserve=float(RESERVE), book_interval_s=0.0)
    engine = Engine(config, knobs=knobs)
    engine.recorder.queue_interval_s = 0.0
    got: list[dict] = []
    run_virtual(
        engine, ArrivalQueue(workload(11)), on_step=lambda s: s.record and got.append(s.record)
    )
    records = [round_record_loads(round_record_dumps(r)) for r in got if r["waiting"] > 1]
    now = time.time()
    kept = 0
    for i, r in enumerate(records[:24]):
        cache.delete(f"live:whatif:{SLUG}:gate")  # one kept per 10 s: these are 10 s apart
        kept += whatif.whatif_keep(r, now=now - (24 - i) * whatif.KEEP_INTERVAL_S)
    return kept


def books_publish() -> None:
    """Two replicas report in turn, the first at its round 152, then the second at its 117,
    each holding part of the same two subtrees (prompts as long as the demo agents')."""
    labels = (
        "You are acme's analyst agent. Tools: search(query) finds documents; fetch(url) reads",
        "You are globex's analyst agent. Tools: search(query) finds documents; fetch(url)",
    )
    at = time.time()
    for i, (engine, seq) in enumerate(zip(ENGINES, (152, 117), strict=True)):
        subtrees = [
            subtree(f"k{j}", label=label, requests=23 - 6 * i + j, position=j, rank=j)
            for j, label in enumerate(labels)
        ]
        rec = record(SLUG, seq, engine=engine, subtrees=subtrees, reserve=float(RESERVE))
        assert book_publish(record=rec, rows=book_rows(rec), now=at + i) == "sent"


def test_the_console_writes_every_figure_by_the_one_rule(page, asgi_server, market):
    assert queues_keep() >= 4
    books_publish()
    url = f"/console/markets/{SLUG}/"
    login(page, asgi_server, "operator", url)
    page.wait_for_selector("#chart-whatif:not([hidden]) .main-svg", timeout=40_000)
    page.wait_for_selector("#book tbody tr .replicas-held")
    failures = []
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 1000})
        page.wait_for_timeout(400)  # the charts follow the window
        page.locator("#whatif").scroll_into_view_if_needed()
        view_shot(page, f"figures-console-{width}")
        page.locator("#book").scroll_into_view_if_needed()
        view_shot(page, f"figures-book-{width}")
        ticks, wrong = wrong_ticks(page, ["chart-whatif", "chart-revenue", "chart-engine"])
        assert any(t["chart"] == "chart-whatif" and t["axis"] == "xaxis" for t in ticks)
        failures += [f"{width} px: tick {t}" for t in wrong]
        failures += [f"{width} px: cut {c}" for c in page.evaluate(REPLICAS_CUT)]
        scroll, inner = page_width(page)
        if scroll > inner:
            failures.append(f"{width} px: the page is {scroll} px wide in {inner}")
    assert failures == []
    # The what-if's reserves and welfare are millionths of a dollar: no SI prefix anywhere.
    texts = [t["text"] for t in page.evaluate(TICKS, ["chart-whatif"])]
    assert not [t for t in texts if any(c in t for c in "µmkMG−")], texts
    # The reserve card: three significant digits, as the cards beside it; every digit in its
    # title (0.005239381 to three digits is 0.00524, by hand).
    assert page.inner_text("#kpi-reserve") == "0.00524 $/s"
    assert page.get_attribute("#kpi-reserve", "title") == "0.005239381 $/s"
    # The book: each replica's latest round, not the last reporter's alone (117 after 152);
    # each replica's count whole, in the order of their ids.
    meta = page.inner_text("#book-meta")
    assert f"rounds {ENGINES[0]} 152 · {ENGINES[1]} 117" in meta, meta
    held = page.inner_text("#book tbody tr:first-child .replicas-held")
    assert f"{ENGINES[0]}: 23" in held and f"{ENGINES[1]}: 17" in held, held


def test_the_dashboard_headers_agree_with_their_cells_and_now_leaves_the_legend(
    page, asgi_server, market
):
    tenant = tenant_create("acme")
    budget_set(tenant=tenant, limit="50", period="month")
    user_create("acme_admin", tenant=tenant, role=Role.ADMIN)
    now = datetime.now(UTC)
    for i, (ttft, e2e, cls) in enumerate(
        [(0.21, 1.5, "interactive"), (0.0847, 0.9, "interactive"), (12.5, 14.25, "background")]
    ):
        Request.objects.create(
            request_id=f"figures-{i}", tenant=tenant, market=market, request_class=cls,
            bid=Decimal("0.0126"), status="served", created_at=now - timedelta(seconds=30 - i),
            finished_at=now - timedelta(seconds=20 - i), ttft_s=ttft, e2e_s=e2e,
            prompt_tokens=812, cached_tokens=640, completion_tokens=64,
        )  # fmt: skip
    login(page, asgi_server, "acme_admin", "/tenants/acme/dashboard/")
    page.wait_for_selector("#requests tbody tr")
    page.wait_for_selector("#chart-pacing .legend")
    failures = []
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 1000})
        page.wait_for_timeout(400)
        view_shot(page, f"figures-dashboard-{width}")
        failures += [f"{width} px: {m}" for m in page.evaluate(UNIT_MISMATCHES, "requests")]
        if meet := page.evaluate(NOW_ON_LEGEND):
            failures.append(f"{width} px: 'now' lies on the spend chart's legend: {meet}")
        failures += [f"{width} px: tick {t}" for t in wrong_ticks(page, ["chart-pacing"])[1]]
        scroll, inner = page_width(page)
        if scroll > inner:
            failures.append(f"{width} px: the page is {scroll} px wide in {inner}")
    assert failures == []
    # The cells carry their units, by the rule: 0.21 s is 210 ms, 0.0847 s 84.7 ms; 14.25 s
    # to three digits, half up, 14.3 s.
    ttfts = page.locator("#requests tbody tr td:nth-child(10)").all_inner_texts()
    assert sorted(ttfts) == sorted(["210 ms", "84.7 ms", "12.5 s"]), ttfts
    e2es = page.locator("#requests tbody tr td:nth-child(11)").all_inner_texts()
    assert sorted(e2es) == sorted(["1.5 s", "900 ms", "14.3 s"]), e2es
    heads = page.locator("#requests thead th").all_inner_texts()
    assert [h.split("\n")[0] for h in heads[9:11]] == ["TTFT", "E2E"], heads
