"""Issue 48: the console's change logs at 1024, 1440 and 1920 px, once the automatic reserve has
written values such as ``0.005239381``: no page scrolls sideways, and each change table stays
inside its card. And the API reference (Redoc) keeps an error code such as
``invalid_request_error`` on one line instead of breaking it mid-word.

Screenshots: test-results/screenshots/ ``change-logs-<width>.png``,
``api-reference-errors-<width>.png``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from market.models import ControlChange, Market, ReserveChange
from tests.accounts.factories import user_create
from tests.browser.conftest import SCREENSHOTS, browser_market_create, login, screenshot

pytestmark = pytest.mark.browser

WIDTHS = (1024, 1440, 1920)

# Each change table's box against its card's (the section around it).
SPILLS = """() => [...document.querySelectorAll('#reserve-audit, #control-audit')].map((t) => {
    const card = t.closest('section.card').getBoundingClientRect();
    const box = t.getBoundingClientRect();
    return {id: t.id, left: box.left, right: box.right, cardLeft: card.left,
            cardRight: card.right};
}).filter((b) => b.left < b.cardLeft - 0.5 || b.right > b.cardRight + 0.5)"""

AUTO_VALUES = ("0.005239381", "0.005894304", "0.006631092", "0.007460  ", "0.008392500")


@pytest.fixture
def logged_market(asgi_server, transactional_db) -> Market:
    market = browser_market_create(
        "layout-llm", "Layout LLM", auto_reserve=True, auto_reserve_target_s=2.5
    )
    operator = user_create("operator", staff=True)
    at = datetime(2026, 12, 6, 5, 0, tzinfo=UTC)
    old = Decimal("0.004657228")
    ReserveChange.objects.create(
        market=market, changed_by=operator, old=Decimal(0), new=old, at=at
    )  # typed by hand: shown as typed
    for i, value in enumerate(AUTO_VALUES):
        new = Decimal(value.strip())
        ReserveChange.objects.create(
            market=market, automatic=True, old=old, new=new, at=at + timedelta(seconds=10 * i + 10)
        )
        old = new
    market.reserve = old
    market.save(update_fields=["reserve"])
    controls = [
        ("policy", "dfs-auction-kv-split", "dfs-auction-density"),
        ("policy", "dfs-auction-density", "dfs-auction-kv-split"),
        ("reserve_max", "1.000000000", "0.250000000"),
        ("auto_reserve", "off", "on, p90 <= 2.5 s"),
        ("alert_ttft_p99", "", "0.001"),
        ("wait_bound_s", "0", "3600"),
    ]
    for i, (control, was, now) in enumerate(controls):
        ControlChange.objects.create(
            market=market, control=control, changed_by=operator, old=was, new=now,
            at=at + timedelta(minutes=i),
        )  # fmt: skip
    return market


def test_the_change_logs_fit_their_cards_at_every_width(page, asgi_server, logged_market):
    url = f"/console/markets/{logged_market.slug}/"
    login(page, asgi_server, "operator", url)
    page.wait_for_selector("#reserve-audit tbody tr")
    page.wait_for_selector("#control-audit tbody tr")
    assert page.locator("#reserve-audit .badge-auto").count() == len(AUTO_VALUES)
    failures = []
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 1000})
        page.wait_for_timeout(300)
        page.locator("#reserve-audit").scroll_into_view_if_needed()
        screenshot(page, f"change-logs-{width}")
        scroll, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        print(f"{width} px: page {scroll} px wide in {inner}")
        if scroll > inner:
            failures.append(f"{width} px: the page is {scroll} px wide in {inner}")
        for spill in page.evaluate(SPILLS):
            failures.append(f"{width} px: {spill}")
    assert failures == []
    # The automatic reserve's values read by the one rule (three significant digits), every
    # digit kept in the row's data and the title.
    row = page.inner_text("#reserve-audit tbody tr:first-child")
    assert "0.00746 → 0.00839" in row, row
    cell = page.locator("#reserve-audit tbody tr:first-child td.num")
    assert cell.get_attribute("data-new") == "0.008392500"
    assert "0.0083925" in cell.inner_html()
    # The one typed by hand is shown as typed.
    assert "0 → 0.004657228" in page.inner_text("#reserve-audit tbody tr:last-child")


def test_an_automatic_move_appears_in_the_log_without_a_reload(page, asgi_server, logged_market):
    url = f"/console/markets/{logged_market.slug}/"
    login(page, asgi_server, "operator", url)
    page.wait_for_selector("#reserve-audit tbody tr")
    new = Decimal("0.009441563")
    ReserveChange.objects.create(
        market=logged_market, automatic=True, old=logged_market.reserve, new=new,
        at=datetime(2026, 12, 6, 5, 1, tzinfo=UTC),
    )  # fmt: skip
    Market.objects.filter(pk=logged_market.pk).update(reserve=new)
    result = {
        "kind": "round.result", "market": logged_market.slug, "at": 0, "round_id": "r:1",
        "rounds": 1, "admitted": 0, "revenue": 0, "welfare": 0, "waiting": 0,
        "policy": logged_market.policy, "reserve": float(new),
    }  # fmt: skip
    # The page's own handler, as a websocket message runs it (no engine sends any here).
    page.evaluate("(m) => window.live.onMessage(m, window.live)", result)
    page.wait_for_selector("#reserve-audit tbody tr:first-child td[data-new='0.009441563']")
    row = page.inner_text("#reserve-audit tbody tr:first-child")
    assert "auto" in row and "0.00839 → 0.00944" in row, row
    assert page.locator("#reserve-audit tbody tr").count() == len(AUTO_VALUES) + 2


# The element holding ``invalid_request_error`` in Redoc's error table, and how many lines it takes.
ERROR_CODE = """() => {
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    const found = [];
    while (walker.nextNode()) {
        const node = walker.currentNode;
        if (!node.textContent.includes('invalid_request_error')) continue;
        const el = node.parentElement;
        if (el.offsetParent === null) continue;
        const range = document.createRange();
        range.selectNodeContents(node);
        const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
        found.push({tag: el.tagName, text: node.textContent.slice(0, 60), lines: lines.size});
    }
    return found;
}"""


def test_redoc_keeps_error_codes_whole(page, asgi_server, transactional_db):
    page.goto(f"{asgi_server.url}/docs/api/")
    page.wait_for_selector("h2:has-text('Create a chat completion')")
    page.wait_for_function("document.body.innerText.includes('invalid_request_error')")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    failures = []
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 1000})
        page.wait_for_timeout(300)
        found = page.evaluate(ERROR_CODE)
        assert found, "invalid_request_error is not on the page"
        page.locator("td:has-text('invalid_request_error')").first.scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / f"api-reference-errors-{width}.png"))
        # A code alone in its node (or a short one) sits on one line.
        split = [f for f in found if f["lines"] > 1 and len(f["text"]) <= 40]
        if split:
            failures.append(f"{width} px: {len(split)} split, e.g. {split[0]}")
        scroll, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        if scroll > inner:
            failures.append(f"{width} px: the page is {scroll} px wide in {inner}")
        # The error table fits its column: nothing to scroll to, no text cut at its edge.
        table = page.evaluate(
            """() => { const t = [...document.querySelectorAll('table')].find(
                (t) => t.textContent.includes('invalid_request_error'));
                return [t.scrollWidth, t.clientWidth]; }"""
        )
        if table[0] > table[1]:
            failures.append(f"{width} px: the error table is {table[0]} px wide in {table[1]}")
    assert failures == [], failures
