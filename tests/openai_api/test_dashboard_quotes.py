"""The tenant dashboard's quote curves: each active market's bid -> time to first token, from the
groups of recent bids that ``GET /v1/quotes`` reads, polled by the page as JSON.

History (as ``tests/openai_api/gateway/test_quotes_api.py``'s): 30 requests bid 0.1 $/s and
waited 0.1, 0.2, ..., 3.0 s; 30 bid 0.01 and waited 1, 2, ..., 30 s; 30 bid nothing and waited
10, 20, ..., 300 s. Groups of at least 20 requests from the highest bid down: one per bid level.
Nearest-rank quantiles of 30 waits: p50 the 15th, p90 the 27th, p99 the 30th. The priority
target (3 s at 90%): the 0.1 group's p90 is 2.7 s (within), the 0.01 group's 27 s (not): the
quote is the 0.1 group's median bid.
"""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from accounts.services import api_key_create, request_open, request_settle
from openai_api.gateway.selectors import caches_clear
from tests.accounts.factories import market_create
from tests.personas import PERSONAS, logged_in, world_create

pytestmark = pytest.mark.django_db

URL = "/tenants/acme/dashboard/quotes/"


@pytest.fixture
def world():
    caches_clear()
    world = world_create()
    market = world.market
    market.priority_ttft_s, market.priority_probability = 3.0, 0.9
    market.save()
    key, _ = api_key_create(tenant=world.b, name="b-programs", created_by=None)
    now = timezone.now()
    history = (
        [("0.1", round(0.1 * i, 1)) for i in range(1, 31)]
        + [("0.01", float(i)) for i in range(1, 31)]
        + [("0", 10.0 * i) for i in range(1, 31)]
    )
    for n, (bid, ttft_s) in enumerate(history):  # tenant B's requests: the curve is anonymous
        rid = f"hist-{n}"
        request_open(request_id=rid, tenant=world.b, api_key=key, market=market, bid=bid,
                     hold_amount="0.01", now=now)  # fmt: skip
        request_settle(request_id=rid, prompt_tokens=10, cached_tokens=0, completion_tokens=2,
                       ttft_s=ttft_s, e2e_s=ttft_s + 0.1, now=now)  # fmt: skip
    yield world
    caches_clear()


def test_the_curve_is_the_quotes_groups_lowest_bids_first(client, world) -> None:
    logged_in(client, world, "a_admin")
    body = client.get(URL).json()
    (curve,) = body["markets"]
    assert (curve["market"], curve["model"], curve["reserve"]) == (
        "test-llm", "org/test-llm", "0.000000000"
    )  # fmt: skip
    assert curve["based_on"] == {"requests": 90, "window_s": 600.0}
    assert curve["groups"] == [
        {"median_bid": "0.000000000", "bids_from": "0.000000000", "bids_to": "0.000000000",
         "requests": 30, "ttft_p50_s": 150.0, "ttft_p90_s": 270.0, "ttft_p99_s": 300.0},
        {"median_bid": "0.010000000", "bids_from": "0.010000000", "bids_to": "0.010000000",
         "requests": 30, "ttft_p50_s": 15.0, "ttft_p90_s": 27.0, "ttft_p99_s": 30.0},
        {"median_bid": "0.100000000", "bids_from": "0.100000000", "bids_to": "0.100000000",
         "requests": 30, "ttft_p50_s": 1.5, "ttft_p90_s": 2.7, "ttft_p99_s": 3.0},
    ]  # fmt: skip
    assert curve["target"] == {"ttft_s": 3.0, "probability": 0.9, "bid": "0.100000000"}
    assert curve["reason"] is None  # quoted: nothing to explain
    assert body["poll_s"] > 0
    # The page starts from the same curve, and polls this URL.
    page = client.get("/tenants/acme/dashboard/")
    initial = json.loads(json.dumps(page.context["initial"]))  # as the page's script reads it
    assert initial["quotes"]["url"] == URL
    assert initial["quotes"]["markets"] == body["markets"]
    assert 'id="quote-curves"' in page.content.decode()


def test_a_market_without_history_has_no_groups_and_no_quote(client, world) -> None:
    world.market.is_active = False
    world.market.save()
    market_create("quiet-llm")
    logged_in(client, world, "a_viewer")
    (curve,) = client.get(URL).json()["markets"]  # inactive markets are not drawn
    assert curve["market"] == "quiet-llm"
    assert curve["groups"] == [] and curve["based_on"]["requests"] == 0
    assert curve["target"]["bid"] is None
    # The page shows GET /v1/quotes' reason as it is (window 600 s, no requests).
    assert curve["reason"] == "too few requests served in the last 600 s to quote (0)"


def test_a_target_no_bid_bought_says_why(client, world) -> None:
    """A target of 1 s at 90%: the fastest group's waits (0.1 to 3.0 s) are within 1 s for 10
    of 30, far short of 90%: no quote, and the API's sentence for it."""
    world.market.priority_ttft_s = 1.0
    world.market.save()
    logged_in(client, world, "a_admin")
    (curve,) = client.get(URL).json()["markets"]
    assert curve["target"]["bid"] is None
    assert curve["reason"] == (
        "no recent bid was served within 1 s 90% of the time by a margin clear of chance"
    )


@pytest.mark.parametrize("persona", PERSONAS)
def test_who_sees_the_curves(client, world, persona) -> None:
    response = logged_in(client, world, persona).get(URL)
    want = {"anonymous": 302, "b_admin": 404}.get(persona, 200)
    assert response.status_code == want, (persona, response.status_code)
    if want == 200:
        text = response.content.decode()
        assert "hist-" not in text and "globex" not in text.lower()  # bids and waits only
