"""The operator console and the tenant dashboard in a real browser, on a live market.

The operator watches the order book update, changes the reserve and sees it take effect (the
audit row, then the engine's next round reporting it); a socket that drops reconnects by itself
and the page keeps its last state meanwhile. A tenant watches their spend update live and exports
an invoice as CSV, and cannot open the operator console.
"""

from __future__ import annotations

import re

import pytest

from market.models import Market, ReserveChange
from tests.browser.conftest import LiveMarket, login, screenshot

pytestmark = pytest.mark.browser
PlaywrightTimeout = pytest.importorskip("playwright.sync_api").TimeoutError


def book_version(page) -> int:
    return int(page.get_attribute("#book", "data-version") or 0)


def test_the_operator_watches_the_book_and_moves_the_reserve(page, live_market: LiveMarket):
    url = f"/console/markets/{live_market.market.slug}/"
    login(page, live_market.server, "operator", url)
    page.wait_for_selector("#live-state[data-state=live]")
    # The book fills from real rounds, then keeps changing (diffs at most twice a second).
    page.wait_for_selector("#book tbody tr[data-key]", timeout=45_000)
    first = book_version(page)
    page.wait_for_function(
        f"Number(document.querySelector('#book').dataset.version) >= {first + 3}", timeout=45_000
    )
    # Engine status from the engine's /metrics.
    page.wait_for_function("document.querySelector('#kpi-queue').textContent !== '—'")
    page.wait_for_function("document.querySelector('#kpi-tps').textContent !== '—'")
    # The queue comes and goes: the screenshot waits for a book of a few subtrees (if it comes).
    try:
        page.wait_for_function(
            "document.querySelectorAll('#book tbody tr[data-key]').length >= 3", timeout=20_000
        )
    except PlaywrightTimeout:
        page.wait_for_selector("#book tbody tr[data-key]", timeout=45_000)
    screenshot(page, "console")

    # The socket drops: the page says so discreetly, keeps the book, and reconnects by itself.
    shown = """() => [document.querySelector('#book').dataset.version,
                      document.querySelectorAll('#book tbody tr[data-key]').length]"""
    at_close = page.evaluate(f"() => {{ window.live.ws.close(); return ({shown})(); }}")
    page.wait_for_selector("#live-state[data-state=reconnecting]", timeout=5_000)
    assert page.inner_text("#live-state") == "reconnecting…"
    assert page.evaluate(shown) == at_close
    page.wait_for_selector("#live-state[data-state=live]", timeout=15_000)

    # The reserve: validated, audited, pushed to the engine, applied from its next round.
    page.fill("#reserve-input", "-1")  # the browser refuses it: not an amount
    page.click("#reserve-form button[type=submit]")
    assert page.evaluate("document.querySelector('#reserve-input').validity.valid") is False
    page.fill("#reserve-input", "2000000")  # an amount, above what engines accept: the server
    page.click("#reserve-form button[type=submit]")
    page.wait_for_selector(".flash-error")
    assert "Reserve not changed" in page.inner_text(".flashes")
    assert not ReserveChange.objects.exists()
    page.fill("#reserve-input", "0.002")
    page.click("#reserve-form button[type=submit]")
    page.wait_for_selector("#reserve-audit tbody tr")
    assert "Reserve 0 → 0.002 $/s" in page.inner_text(".flashes")
    audit = page.inner_text("#reserve-audit tbody tr:first-child")
    assert "operator" in audit and "0 → 0.002" in audit
    change = ReserveChange.objects.get(market=live_market.market)
    assert (change.changed_by.username, str(change.new)) == ("operator", "0.002000000")
    assert Market.objects.get(pk=live_market.market.pk).reserve == change.new
    page.wait_for_selector("#kpi-engine-reserve[data-reserve='0.002']", timeout=45_000)
    assert page.inner_text("#kpi-engine-reserve") == "$/s · in effect"
    assert live_market.sim.call(lambda: live_market.sim.server.engine.reserve) == 0.002
    screenshot(page, "console-reserve-changed")


def test_a_tenant_watches_spend_live_and_exports_an_invoice(page, live_market: LiveMarket):
    url = "/tenants/acme/dashboard/"
    login(page, live_market.server, "acme_admin", url)
    page.wait_for_selector("#live-state[data-state=live]")
    before = page.inner_text("#kpi-spent")
    # Spend ticks arrive as the engine's rounds and the token charges settle: no reload.
    page.wait_for_function(
        f"document.querySelector('#kpi-spent').textContent !== {before!r}", timeout=45_000
    )
    page.wait_for_selector("#requests tbody tr[data-request]")
    page.wait_for_function(
        "[...document.querySelectorAll('#requests tbody tr')].some("
        "tr => tr.textContent.includes('served'))",
        timeout=45_000,
    )
    assert "globex" not in page.content().lower()
    page.wait_for_selector("#latency-table tbody tr[data-class]", timeout=45_000)
    screenshot(page, "dashboard")

    with page.expect_download() as download_info:
        page.click("#invoices a:text('CSV')")
    download = download_info.value
    assert re.fullmatch(r"INV-acme-20260101-\d+\.csv", download.suggested_filename)
    with open(download.path(), encoding="utf-8") as csv:
        header = csv.readline()
    assert "request" in header.lower()


def test_a_tenant_cannot_open_the_operator_console(page, live_market: LiveMarket):
    login(page, live_market.server, "acme_admin", "/tenants/acme/dashboard/")
    console = f"{live_market.server.url}/console/markets/{live_market.market.slug}/"
    response = page.goto(console)
    assert response.status == 403
    assert page.goto(f"{live_market.server.url}/console/").status == 403
    # Nor its socket: the handshake is refused.
    outcome = page.evaluate(
        """(path) => new Promise((resolve) => {
            const ws = new WebSocket(`ws://${location.host}${path}`);
            ws.onopen = () => resolve("open");
            ws.onclose = () => resolve("refused");
        })""",
        f"/ws/markets/{live_market.market.slug}/",
    )
    assert outcome == "refused"
    page.goto(f"{live_market.server.url}/tenants/acme/dashboard/")
    assert page.locator("nav a:text('Console')").count() == 0
    screenshot(page, "tenant-no-console")


def test_the_operator_sees_each_replica_and_the_reserve_reaches_both(page, live_fleet: LiveMarket):
    """Two replicas behind SGLang's router: the console's status is the fleet's, with a row per
    replica; the book is merged; a reserve moved in the browser reaches both replicas."""
    url = f"/console/markets/{live_fleet.market.slug}/"
    login(page, live_fleet.server, "operator", url)
    page.wait_for_selector("#live-state[data-state=live]")
    page.wait_for_selector("#replicas:not([hidden]) #replicas-table tbody tr", timeout=30_000)
    engines = page.eval_on_selector_all(
        "#replicas-table tbody tr", "rows => rows.map(r => r.dataset.engine)"
    )
    slug = live_fleet.market.slug
    assert engines == [f"{slug}-r1", f"{slug}-r2"]
    cells = page.inner_text("#replicas-table tbody")
    assert cells.count("up") >= 2 and "down" not in cells
    page.wait_for_selector("#book tbody tr[data-key]", timeout=45_000)
    screenshot(page, "console-replicas")
    page.fill("#reserve-input", "0.003")
    page.click("#reserve-form button[type=submit]")
    page.wait_for_selector("#reserve-audit tbody tr")
    reserves = [r.call(lambda r=r: r.server.engine.reserve) for r in live_fleet.replicas]
    assert reserves == [0.003, 0.003]
