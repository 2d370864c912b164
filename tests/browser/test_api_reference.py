"""The API reference page (``/docs/api/``) in a real browser: Redoc, served from the app's own
static files, renders the OpenAPI document of ``/v1`` (its operations, the bid fields, the
error table), and nothing is loaded from another host (the page's Content-Security-Policy
blocks Redoc's footer logo, the one thing it would fetch from a CDN)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tests.browser.conftest import SCREENSHOTS

pytestmark = pytest.mark.browser


def test_the_reference_renders_from_local_files_only(page, asgi_server, transactional_db):
    loaded: list[str] = []
    page.on("requestfinished", lambda request: loaded.append(request.url))
    answer = page.goto(f"{asgi_server.url}/docs/api/")
    assert answer.status == 200
    # Redoc has fetched /v1/openapi.json and drawn the document: title, operations, errors.
    page.wait_for_selector("h1:has-text('Inference market API')")
    page.wait_for_selector("h2:has-text('Create a chat completion')")
    text = page.inner_text("body")
    for shown in (
        "Create a text completion",
        "Quote what a bid buys",
        "Submit a batch",
        "The budgets this key's requests must fit",
        "X-Bid",
        "X-Request-Class",
        "service_tier",
        "request_class",
        "bid_source",
        "effective_bid",
        "engine_bid_lost",
        "insufficient_quota",
        "queue_full",
        "database_unavailable",
    ):
        assert shown in text, shown
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "api_reference.png"))  # the first screen
    page.locator("h2:has-text('Create a chat completion')").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "api_reference_chat.png"))
    here = urlsplit(asgi_server.url).netloc
    elsewhere = [
        url
        for url in loaded
        if urlsplit(url).scheme in ("http", "https") and urlsplit(url).netloc != here
    ]
    assert elsewhere == []
    assert f"{asgi_server.url}/v1/openapi.json" in loaded
