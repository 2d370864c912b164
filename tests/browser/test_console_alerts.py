"""The console's alerts and automatic reserve in a real browser, on a live market: the operator
sets thresholds the live status crosses and the console raises the alert; thresholds it does not
cross put it down again. The automatic reserve, turned on, shows beside the reserve."""

from __future__ import annotations

import pytest

from market.models import ControlChange, Market
from tests.browser.conftest import LiveMarket, login, screenshot

pytestmark = pytest.mark.browser


def test_the_console_raises_an_alert_when_a_threshold_is_crossed(page, live_market: LiveMarket):
    url = f"/console/markets/{live_market.market.slug}/"
    login(page, live_market.server, "operator", url)
    page.wait_for_selector("#live-state[data-state=live]")
    # Requests finish under load: the engine's TTFT p99 arrives with its status.
    page.wait_for_function(
        "/\\d/.test(document.querySelector('#kpi-ttft').textContent)", timeout=45_000
    )
    assert page.is_hidden("#alerts")  # no threshold yet
    # A TTFT p99 above 1 ms and any queue at all: the live market crosses the first at once.
    page.fill("#alert-queue-input", "0")
    page.fill("#alert-ttft-input", "0.001")
    page.click("#alerts-form button[type=submit]")
    page.wait_for_selector(".flash-success")
    market = Market.objects.get(pk=live_market.market.pk)
    assert (market.alert_queue, market.alert_ttft_p99_s) == (0, 0.001)
    page.wait_for_selector("#alerts:not([hidden])", timeout=30_000)
    page.wait_for_function("document.querySelector('#alerts').dataset.crossed.includes('ttft')")
    banner = page.inner_text("#alerts")
    assert "Alert:" in banner and "TTFT p99:" in banner
    assert "above the threshold of 1 ms" in banner or "above the threshold of 1.0 ms" in banner
    assert page.is_visible("#kpi-ttft") and "alerting" in page.get_attribute(
        "xpath=//*[@id='kpi-ttft']/..", "class"
    )
    screenshot(page, "console-alert")
    # Thresholds far above what the market does: the alert goes at the next status.
    page.fill("#alert-queue-input", "100000")
    page.fill("#alert-ttft-input", "3600")
    page.click("#alerts-form button[type=submit]")
    page.wait_for_selector(".flash-success")
    page.wait_for_function("document.querySelector('#kpi-ttft').textContent !== '—'")
    page.wait_for_selector("#alerts", state="hidden", timeout=30_000)
    assert "alerting" not in page.get_attribute("xpath=//*[@id='kpi-ttft']/..", "class")
    audit = ControlChange.objects.filter(market=market).order_by("id")
    assert [(c.control, c.new) for c in audit] == [
        ("alert_queue", "0"),
        ("alert_ttft_p99", "0.001"),
        ("alert_queue", "100000"),
        ("alert_ttft_p99", "3600"),
    ]


def test_the_automatic_reserve_shows_beside_the_reserve(page, quiet_market: LiveMarket):
    url = f"/console/markets/{quiet_market.market.slug}/"
    login(page, quiet_market.server, "operator", url)
    assert "Off:" in page.inner_text("#auto-reserve-state")
    page.check("#auto-reserve-enabled")
    page.fill("#auto-reserve-target", "1.5")
    page.click("#auto-reserve-form button[type=submit]")
    page.wait_for_selector("#kpi-auto-reserve")
    assert page.inner_text("#kpi-auto-reserve") == "auto · p90 ≤ 1.5 s"
    assert "toward a TTFT p90 of 1.5 s" in page.inner_text("#auto-reserve-state")
    screenshot(page, "console-auto-reserve")
    # A reserve set by hand takes it back: the automatic reserve goes off, audited.
    page.fill("#reserve-input", "0.003")
    page.click("#reserve-form button[type=submit]")
    page.click("#reserve-confirm button[type=submit]")  # from no reserve: asked first
    page.wait_for_selector("#reserve-audit tbody tr")
    assert page.query_selector("#kpi-auto-reserve") is None
    assert "Off:" in page.inner_text("#auto-reserve-state")
    assert "off" in page.inner_text("#control-audit tbody tr:first-child")
