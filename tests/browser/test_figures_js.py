"""The browser's copy of the figures' rule (static/js/numbers.js), run by Chromium, against the
hand-written table the server's rule (accounts/figures.py) is checked against in
tests/accounts/test_figures.py: the live pages and the server write the same text."""

from __future__ import annotations

import pytest

from tests.accounts.test_figures import TABLE
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.browser

JS_NAMES = {"usd_per_s": "usdPerS"}  # the rest are spelled alike


def test_the_browser_writes_each_figure_as_the_server_does(browser):
    context = browser.new_context()
    try:
        page = context.new_page()
        page.add_script_tag(path=str(REPO_ROOT / "static" / "js" / "numbers.js"))
        calls = [[JS_NAMES.get(name, name), value] for name, value, _ in TABLE]
        got = page.evaluate("(calls) => calls.map(([name, value]) => numbers[name](value))", calls)
    finally:
        context.close()
    wrong = [(n, v, g, e) for (n, v, e), g in zip(TABLE, got, strict=True) if g != e]
    assert wrong == []
    assert len(got) == len(TABLE) > 50


def test_what_the_server_refuses_reads_as_a_dash_in_the_browser(browser):
    """A page never throws on a figure: what is not a finite number reads "—"."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.add_script_tag(path=str(REPO_ROOT / "static" / "js" / "numbers.js"))
        got = page.evaluate(
            """() => [NaN, Infinity, "NaN", "", "twelve", true, null, undefined]
                .map((v) => [numbers.usd(v), numbers.duration(v), numbers.usdPerS(v)])"""
        )
    finally:
        context.close()
    assert got == [["—", "—", "—"]] * 8
