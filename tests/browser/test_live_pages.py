"""The operator console and the tenant dashboard in a real browser, on a live market.

The operator watches the order book update, changes the reserve and sees it take effect (the
audit row, then the engine's next round reporting it); a socket that drops reconnects by itself
and the page keeps its last state meanwhile. A tenant watches their spend update live and exports
an invoice as CSV, and cannot open the operator console.
"""

from __future__ import annotations

import re
import threading

import httpx
import pytest

from market.models import Market, ReserveChange
from tests.browser.conftest import LiveMarket, login, screenshot
from tests.openai_api.helpers import wait_until

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
    page.fill("#reserve-input", "2000000")  # an amount, above the market's ceiling: refused
    page.wait_for_selector("#reserve-impact.bad:not([hidden])")
    assert "Above the ceiling (1 $/s)" in page.inner_text("#reserve-impact")
    page.click("#reserve-form button[type=submit]")
    page.wait_for_selector("#reserve-refused")  # beside the field, the field as typed
    assert "Reserve not changed: 2000000 $/s is above" in page.inner_text("#reserve-refused")
    assert page.input_value("#reserve-input") == "2000000"
    assert not ReserveChange.objects.exists()
    # From no reserve at all, 0.002 is far: the form says what it does to the book as it is
    # typed, and the console asks before applying it, with the book's count.
    page.fill("#reserve-input", "0.002")
    page.wait_for_function(  # the line follows what is typed (it said 2000000's refusal)
        "(o => !o.hidden && !o.textContent.includes('Above the ceiling'))"
        "(document.querySelector('#reserve-impact'))"
    )
    assert "you will be asked to confirm" in page.inner_text("#reserve-impact")
    page.click("#reserve-form button[type=submit]")
    page.wait_for_selector("#reserve-confirm")
    question = page.inner_text("#reserve-confirm")
    assert "Set the reserve to 0.002 $/s?" in question, question
    assert re.search(r"\d+ of \d+ waiting bids? (is|are) below it", question) or (
        "No book has come" in question or "The book is empty now" in question
    ), question
    assert not ReserveChange.objects.exists()
    screenshot(page, "console-reserve-confirm")
    page.click("#reserve-confirm button[type=submit]")
    page.wait_for_selector("#reserve-audit tbody tr")
    assert "Reserve 0 → 0.002 $/s" in page.inner_text(".flashes")
    audit = page.inner_text("#reserve-audit tbody tr:first-child")
    assert "operator" in audit and "0 → 0.002" in audit
    change = ReserveChange.objects.get(market=live_market.market)
    assert (change.changed_by.username, str(change.new)) == ("operator", "0.002000000")
    assert Market.objects.get(pk=live_market.market.pk).reserve == change.new
    page.wait_for_selector("#kpi-engine-reserve[data-reserve='0.002']", timeout=45_000)
    assert page.inner_text("#kpi-engine-reserve") == "in effect"  # the $/s is on the value
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
    # What a bid buys: the market's bid -> time to first token curve, from the quotes' groups
    # of recent bids (20 requests a group), polled while the agents' requests are served.
    curve = f"#quote-curves .quote-curve[data-market='{live_market.market.slug}']"
    page.wait_for_function(
        f'Number(document.querySelector("{curve}")?.dataset.groups) >= 2', timeout=120_000
    )
    points = page.evaluate(
        f'() => document.querySelector("{curve} .js-plotly-plot").data.map(t => t.x.length)'
    )
    assert len(points) >= 2 and points[0] >= 2 and points[0] == points[1], points  # p50, p90
    assert "Bid " in page.inner_text(f"{curve} .quote-target") or "No recent bid" in (
        page.inner_text(f"{curve} .quote-target")
    )
    page.locator("#quotes").scroll_into_view_if_needed()
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
    """Two replicas behind SGLang's model gateway: the console's status is the fleet's, a row per
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
    page.click("#reserve-confirm button[type=submit]")  # from no reserve: asked first
    page.wait_for_selector("#reserve-audit tbody tr")
    reserves = [r.call(lambda r=r: r.server.engine.reserve) for r in live_fleet.replicas]
    assert reserves == [0.003, 0.003]


BOOK_ROWS = """() => [...document.querySelectorAll('#book tbody tr[data-key]')].map(tr => ({
    key: tr.dataset.key, depth: tr.className.includes('depth-2') ? 2 : 1,
    position: tr.cells[0].textContent, label: tr.cells[1].querySelector('.prefix').textContent,
    tenants: [...tr.cells[2].querySelectorAll('.tenant')].map(t => t.dataset.tenant),
}))"""


def test_the_operator_reads_the_book_and_switches_the_policy_once_asked(
    page, live_market: LiveMarket
):
    """The book: one position column saying what it means, whose requests wait in each subtree,
    and sub-subtrees labelled where they leave their parent (the agents' prompts share a system
    prompt and differ after "Case"). The policy switch says what each policy does, asks first,
    and its audit row shows who switched what, beside the reserve's."""
    url = f"/console/markets/{live_market.market.slug}/"
    login(page, live_market.server, "operator", url)
    page.wait_for_selector("#live-state[data-state=live]")
    header = page.inner_text("#book thead")
    assert "POSITION" in header.upper() and "1 = served next" in header
    assert "RANK" not in header.upper() and "TENANTS" in header.upper()
    # Wait for a book with a subtree holding two sub-subtrees and both tenants in it.
    page.wait_for_function(
        f"""() => {{
            const rows = ({BOOK_ROWS})();
            const tenants = new Set(rows.flatMap(r => r.tenants));
            return rows.filter(r => r.depth === 2).length >= 2 && tenants.size >= 2;
        }}""",
        timeout=60_000,
    )
    rows = page.evaluate(BOOK_ROWS)
    assert {t for r in rows for t in r["tenants"]} <= {"acme", "globex"}
    assert all(re.fullmatch(r"#[\d,]+", r["position"]) for r in rows), rows
    # Each sub-subtree sits under its parent, and siblings' labels differ.
    parents = {}
    for r in rows:
        if r["depth"] == 1:
            current = r["key"]
        else:
            parents.setdefault(current, []).append(r["label"])
    assert parents, rows
    for labels in parents.values():
        assert len(labels) == len(set(labels)), labels
    screenshot(page, "console-book-tenants")

    # The policy switch: each option's line, then a question, then the audit row.
    assert "compete one by one" in page.inner_text("#policy-description")
    page.select_option("#policy-select", "dfs-auction-density")
    assert "siblings by bid per token" in page.inner_text("#policy-description")
    page.click("#policy-form button[type=submit]")
    page.wait_for_selector("#policy-confirm")
    assert "Switch the ordering policy from dfs-auction-kv-split to dfs-auction-density?" in (
        page.inner_text("#policy-confirm")
    )
    assert Market.objects.get(pk=live_market.market.pk).policy == "dfs-auction-kv-split"
    screenshot(page, "console-policy-confirm")
    page.click("#policy-confirm button[type=submit]")
    page.wait_for_selector("#control-audit tbody tr")
    audit = page.inner_text("#control-audit tbody tr:first-child")
    assert "operator" in audit and "policy dfs-auction-kv-split → dfs-auction-density" in audit, (
        audit
    )
    assert Market.objects.get(pk=live_market.market.pk).policy == "dfs-auction-density"
    page.wait_for_selector("#kpi-engine-policy[data-policy='dfs-auction-density']", timeout=45_000)
    screenshot(page, "console-policy-audited")


def test_a_tenant_reads_each_requests_place_in_line(page, quiet_market: LiveMarket):
    """Five requests, ranks worked by hand. A long prompt (12,000 tokens: 16 chunks of 768 at
    1 ms a token, ~12 s) is admitted alone (#1 of 1); while it is prefilled no round runs, so
    four requests sent meanwhile are first ordered together, by the round after its last chunk.
    Their prompts have the same number of tokens and distinct first tokens (four subtrees of
    equal work under the root): dfs-auction-density orders them by bid, 0.1 > 0.05 > 0.01 >
    0.001 $/s: #1, #2, #3, #4 of 4."""
    live = quiet_market
    market = live.market.served_model
    headers = {"Authorization": f"Bearer {live.keys['acme']}"}
    engine = live.sim.server.engine
    ids: dict[str, str] = {}

    def send(name: str, prompt: str, bid: str) -> None:
        body = {"model": market, "prompt": prompt, "max_tokens": 2, "bid": bid}
        answer = httpx.post(f"{live.server.url}/v1/completions", json=body, headers=headers,
                            timeout=90)  # fmt: skip
        assert answer.status_code == 200, answer.text
        ids[name] = answer.json()["id"].removeprefix("cmpl-")

    blocker = threading.Thread(target=send, args=("long", "block " * 6000, "0"))
    blocker.start()
    wait_until(lambda: live.sim.call(lambda: engine.chunked is not None), timeout_s=30)
    bids = {"alpha": "0.001", "bravo": "0.1", "charlie": "0.01", "delta": "0.05"}
    senders = [
        threading.Thread(target=send, args=(n, f"{n} " + "words of a long document " * 20, b))
        for n, b in bids.items()
    ]
    for t in senders:
        t.start()
    # All four wait, and the long prompt is still being prefilled: no round has ordered them.
    wait_until(
        lambda: live.sim.call(lambda: len(engine.waiting) == 4 and engine.chunked is not None),
        timeout_s=30,
    )
    for t in [blocker, *senders]:
        t.join(timeout=90)
    assert set(ids) == {"long", *bids}

    login(page, live.server, "acme_admin", "/tenants/acme/dashboard/")
    page.wait_for_selector("#requests tbody tr[data-request]")

    def rank_of(name: str) -> str:
        return page.inner_text(f"#requests tr[data-request='{ids[name]}'] td:nth-child(6)")

    shown = {name: rank_of(name) for name in ids}
    assert shown == {
        "long": "#1 of 1",
        "bravo": "#1 of 4",
        "delta": "#2 of 4",
        "charlie": "#3 of 4",
        "alpha": "#4 of 4",
    }, shown
    title = page.get_attribute(f"#requests tr[data-request='{ids['alpha']}'] td:nth-child(6)",
                               "title")  # fmt: skip
    assert title.startswith("3 waiting ahead of it"), title
    screenshot(page, "dashboard-ranks")
