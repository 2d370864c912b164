"""Issue 48: a refused change on the console is said where it was made. The issue's operator set
a reserve of 1,000,000 $/s (above the ceiling): the page jumped to the controls, the red banner
at the top was out of view, and the field silently went back to the value in force.

Now, for every control that can be refused (the reserve, the automatic reserve, the policy, the
wait bound, the ceiling, the alerts): the page comes back with the refusal beside the field, in
view, announced (``role="alert"``) and tied to the field (``aria-invalid``,
``aria-describedby``, the focus), and the field keeps what was typed. Once: a reload shows the
value in force again. No page scrolls sideways at 1024, 1440 or 1920 px.

Screenshots: test-results/screenshots/ ``refusal-reserve-<width>.png`` and
``refusal-<control>-1440.png``.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from market.models import ControlChange, Market, ReserveChange
from tests.accounts.factories import user_create
from tests.browser.conftest import SCREENSHOTS, browser_market_create, login

pytestmark = pytest.mark.browser

WIDTHS = (1024, 1440, 1920)
RESERVE = Decimal("0.01")  # $/s in force
CEILING = Decimal("1")  # $/s, the default ceiling

# Where the refusal is against the field and the window, as the operator sees them.
PLACED = """([control, field]) => {
    const refusal = document.getElementById(`${control}-refused`);
    const input = document.getElementById(field);
    if (!refusal || !input) return null;
    const r = refusal.getBoundingClientRect(), f = input.getBoundingClientRect();
    return {
        text: refusal.textContent.trim(),
        role: refusal.getAttribute('role'),
        visible: refusal.offsetParent !== null,
        inView: r.top >= 0 && r.bottom <= window.innerHeight,
        below: r.top - f.bottom,
        sameForm: refusal.closest('form') === input.closest('form'),
        value: input.value,
        invalid: input.getAttribute('aria-invalid'),
        describedBy: input.getAttribute('aria-describedby'),
        focused: document.activeElement === input
            || document.activeElement === input.closest('form').querySelector('[aria-invalid]'),
        scroll: document.documentElement.scrollWidth,
        inner: window.innerWidth,
    };
}"""


@pytest.fixture
def market(asgi_server, transactional_db) -> Market:
    market = browser_market_create("refusal-llm", "Refusal LLM", reserve=RESERVE)
    user_create("operator", staff=True)
    return market


def refused(page, control: str, field: str) -> dict:
    page.wait_for_selector(f"#{control}-refused")
    page.wait_for_timeout(200)  # the scroll to the field
    placed = page.evaluate(PLACED, [control, field])
    assert placed is not None
    return placed


def assert_said_beside(placed: dict, typed: str, words: str) -> None:
    assert words in placed["text"], placed
    assert placed["role"] == "alert" and placed["visible"] and placed["inView"], placed
    assert placed["sameForm"] and 0 <= placed["below"] < 120, placed
    assert placed["value"] == typed, placed  # what was typed, not the value in force
    assert placed["invalid"] == "true" and placed["describedBy"].endswith("-refused"), placed
    assert placed["focused"], placed  # the keyboard is where the refusal is
    assert placed["scroll"] <= placed["inner"], placed


def test_a_refused_reserve_is_said_beside_the_field_and_keeps_what_was_typed(
    page, asgi_server, market
):
    url = f"/console/markets/{market.slug}/"
    login(page, asgi_server, "operator", url)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{asgi_server.url}{url}")
        page.fill("#reserve-input", "1000000")
        page.click("#reserve-form button[type=submit]")
        placed = refused(page, "reserve", "reserve-input")
        assert_said_beside(
            placed,
            "1000000",
            "Reserve not changed: 1000000 $/s is above this market's ceiling of 1 $/s",
        )
        screenshot_view(page, f"refusal-reserve-{width}")
        assert page.locator(".flashes").count() == 0  # said once, beside the field
    assert Market.objects.get(pk=market.pk).reserve == RESERVE
    assert not ReserveChange.objects.exists()
    # Said once: the next visit shows the value in force and no refusal.
    page.goto(page.url)
    page.wait_for_selector("#reserve-form")
    assert page.locator("#reserve-refused").count() == 0
    assert page.input_value("#reserve-input") == "0.01"
    assert page.get_attribute("#reserve-input", "aria-invalid") is None


# (control, its field, what is typed there, the words of the refusal)
OTHERS = [
    ("reserve-max", "reserve-max-input", "0.001", "below the reserve in force"),
    ("wait-bound", "wait-bound-input", "99999", "Wait bound not changed"),
    ("auto-reserve", "auto-reserve-target", "-3", "Automatic reserve not changed: '-3'"),
    ("alerts", "alert-queue-input", "-2", "Alerts not changed"),
]


@pytest.mark.parametrize(("control", "field", "typed", "words"), OTHERS)
def test_every_other_refused_control_is_said_beside_its_field(
    page, asgi_server, market, control, field, typed, words
):
    url = f"/console/markets/{market.slug}/"
    login(page, asgi_server, "operator", url)

    def controls(m: Market) -> tuple:
        return (m.reserve_max, m.wait_bound_mode, m.wait_bound_s, m.auto_reserve)

    before = controls(Market.objects.get(pk=market.pk))
    assert before[0] == CEILING and before[3] is False
    if control == "alerts":
        page.fill("#alert-ttft-input", "2.5")  # the other field of the form: kept too
    if control == "wait-bound":
        page.select_option("#wait-bound-mode", "pinned")  # a length is read when pinned
    page.fill(f"#{field}", typed)
    page.click(f"#{control}-form button[type=submit]")
    assert_said_beside(refused(page, control, field), typed, words)
    if control == "alerts":
        assert page.input_value("#alert-ttft-input") == "2.5"
    if control == "wait-bound":
        assert page.input_value("#wait-bound-mode") == "pinned"  # the choice kept too
    screenshot_view(page, f"refusal-{control}-1440")
    fresh = Market.objects.get(pk=market.pk)
    assert controls(fresh) == before
    assert (fresh.alert_queue, fresh.alert_ttft_p99_s) == (None, None)
    assert not ControlChange.objects.exists()


def test_a_refused_policy_is_said_beside_the_switch(page, asgi_server, market):
    """A policy the switch no longer offers (a page left open while it was withdrawn): the
    option is put back in the page as it was, and sent."""
    url = f"/console/markets/{market.slug}/"
    login(page, asgi_server, "operator", url)
    page.evaluate(
        """() => { const s = document.getElementById('policy-select');
                   s.add(new Option('highest-bid', 'highest-bid')); s.value = 'highest-bid'; }"""
    )
    page.click("#policy-form button[type=submit]")
    placed = refused(page, "policy", "policy-select")
    assert "Policy not changed" in placed["text"] and "not offered" in placed["text"], placed
    assert placed["role"] == "alert" and placed["inView"] and placed["sameForm"], placed
    assert placed["invalid"] == "true" and placed["focused"], placed
    screenshot_view(page, "refusal-policy-1440")
    assert Market.objects.get(pk=market.pk).policy == "dfs-auction-kv-split"
    assert not ControlChange.objects.exists()


def screenshot_view(page, name: str) -> None:
    """What the operator sees at that moment (the window, not the whole page)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
