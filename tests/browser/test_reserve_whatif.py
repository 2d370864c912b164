"""The reserve what-if on a live market in a real browser: the operator sets a reserve, the
engine's round records bring their waiting queues, and the chart beside the reserve control
shows revenue, welfare and the share keeping priority against the reserve, the current reserve
marked and the caveat that bidders may respond said on the chart. Screenshot at 1440 px:
test-results/screenshots/console-reserve-whatif.png."""

from __future__ import annotations

import time

import pytest

from market.live.whatif import whatif_rounds
from market.models import Market
from tests.browser.conftest import LiveMarket, login, screenshot

pytestmark = pytest.mark.browser

RESERVE = "0.005"  # $/s: among the load's bids (0.0005 to 0.075 $/s)

CHART = """() => {
  const gd = document.getElementById('chart-whatif');
  if (!gd || gd.hidden || !gd.data) return null;
  return {
    names: gd.data.map((t) => t.name),
    xs: gd.data.map((t) => t.x),
    ys: gd.data.map((t) => t.y),
    shapes: (gd.layout.shapes || []).map((s) => [s.x0, s.x1]),
    notes: (gd.layout.annotations || []).map((a) => a.text),
    width: gd.getBoundingClientRect().width,
  };
}"""


def bids(slug: str) -> set[float]:
    """The distinct bids waiting in the market's kept queues."""
    return {b for kept in whatif_rounds(slug) for b in kept["queue"]["bid"]}


def test_the_what_if_chart_shows_the_recorded_queues_against_the_reserve(
    page, live_market: LiveMarket
):
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    slug = live_market.market.slug
    url = f"/console/markets/{slug}/"
    login(page, live_market.server, "operator", url)
    page.wait_for_selector("#live-state[data-state=live]")
    # From no reserve every raise asks first.
    page.fill("#reserve-input", RESERVE)
    page.click("#reserve-form button[type=submit]")
    page.click("#reserve-confirm button[type=submit]")
    page.wait_for_selector("#reserve-audit tbody tr")
    assert str(Market.objects.get(pk=live_market.market.pk).reserve.normalize()) == RESERVE
    # The engine's records bring their queues with the book; one is kept every 10 s. Enough
    # of them for a grid: a few distinct bids waiting.
    deadline = time.monotonic() + 60
    while len(bids(slug)) < 4 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(bids(slug)) >= 4, "no recorded queue kept"
    page.reload()
    page.wait_for_selector("#chart-whatif:not([hidden]) .main-svg", timeout=40_000)
    chart = page.evaluate(CHART)
    assert chart is not None
    assert chart["names"][:3] == ["revenue", "welfare", "keeping priority"]
    reserves = chart["xs"][0]
    assert reserves[0] == 0 and 0.005 in reserves and len(reserves) > 3
    # The current reserve is marked, on the chart and in its note.
    assert chart["shapes"] == [[0.005, 0.005]]
    assert any(n.startswith("current 0.005") for n in chart["notes"])
    assert any("Bidders may respond to a new reserve" in n for n in chart["notes"])
    # With live data: the load's bids keep priority at no reserve, fewer above the current one.
    shares = chart["ys"][2]
    assert shares[0] > 0 and shares[-1] < shares[0]
    # A curve for each, point by point: charges are never negative, welfare is a loss.
    assert all(len(ys) == len(reserves) for ys in chart["ys"][:3])
    assert min(chart["ys"][0]) >= 0 and max(chart["ys"][1]) <= 0
    assert "Bidders may respond to a new reserve" in page.inner_text("#whatif-caveat")
    assert "recorded round" in page.inner_text("#whatif-meta")
    # Beside the reserve control: in the same column, right under the controls.
    controls = page.locator("#controls").bounding_box()
    card = page.locator("#whatif").bounding_box()
    assert abs(card["x"] - controls["x"]) < 1 and card["y"] > controls["y"]
    page.locator("#whatif").scroll_into_view_if_needed()
    screenshot(page, "console-reserve-whatif")
    assert errors == []
