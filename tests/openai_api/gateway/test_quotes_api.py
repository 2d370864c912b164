"""``GET /v1/quotes``: a program asks, with its API key, what bid buys a first token within T
seconds, and what waits a bid buys, from the market's recent requests.

The market's history is written with the ledger's services (opened, then settled with the time
to first token the engine reported), the same as ``tests/mechanism/test_quotes.py``'s: 30
requests bid 0.1 $/s and waited 0.1..3.0 s, 30 bid 0.01 and waited 1..30 s, 30 bid nothing and
waited 10..300 s; the quoted figures are worked there by hand. A quote for p = 0.5 reads a
group's 21st wait of 30 (its confident median), for p = 0.9 or 0.99 its 30th.
"""

from __future__ import annotations

from decimal import Decimal

import httpx
import pytest
from django.utils import timezone

from accounts.ledger.store import PriorityCharge
from accounts.services import request_open, request_settle
from market.live import book
from openai_api.gateway.selectors import caches_clear
from openai_api.openapi.document import openapi_document
from tests.market.live_helpers import record, subtree
from tests.openai_api.conftest import market_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quoted_market(acme):
    return history_write(acme)


def history_write(acme, *, queue_len: int | None = None):
    """A market with the module's history; with ``queue_len``, each request's priority entry
    says it joined a queue of that many (the engine's round record's ``queue_len``)."""
    market = market_create(engine_url="http://127.0.0.1:9")  # history only, never called
    now = timezone.now()
    history = (
        [("0.1", round(0.1 * i, 1)) for i in range(1, 31)]
        + [("0.01", float(i)) for i in range(1, 31)]
        + [("0", 10.0 * i) for i in range(1, 31)]
    )
    for n, (bid, ttft_s) in enumerate(history):
        rid = f"hist-{n}"
        request_open(request_id=rid, tenant=acme.tenant, api_key=acme.api_key, market=market,
                     bid=bid, hold_amount="0.01", now=now)  # fmt: skip
        priority = None if queue_len is None else PriorityCharge(
            amount=Decimal("0"), round_id=f"sim:e:{n}",
            detail={"bid": float(bid), "effective_bid": float(bid), "time_saved_s": 0.0,
                    "planned_completion_s": ttft_s, "position": 0, "engine_charge": 0.0,
                    "block": {}, "rank": 1, "ahead": 0, "queue_len": queue_len},
        )  # fmt: skip
        request_settle(request_id=rid, prompt_tokens=10, cached_tokens=0, completion_tokens=2,
                       ttft_s=ttft_s, e2e_s=ttft_s + 0.1, priority=priority, now=now)  # fmt: skip
    return market


def book_publish(monkeypatch, market, *, waiting: dict[str, int], now: float) -> None:
    """Each engine's round record with a book and ``waiting`` requests, published to the
    market's live book (``market.live.book``; the websocket message is not sent)."""
    monkeypatch.setattr(book, "group_send", lambda group, payload: None)
    for engine, n in waiting.items():
        rec = record(market.slug, 1, engine=engine, waiting=n, subtrees=[subtree(engine)])
        outcome = book.book_publish(record=rec, rows=book.book_rows(rec), now=now)
        assert outcome in ("sent", "unchanged")  # unchanged: the same rows, a new queue length
        now += book.MIN_INTERVAL_S


def ask(gateway, key: str | None, **query) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{gateway.url}/v1/quotes", params=query, headers=headers, timeout=30)


def test_the_bid_for_a_target_and_the_waits_of_a_bid(gateway, acme, quoted_market) -> None:
    model = quoted_market.served_model
    answer = ask(gateway, acme.key, model=model, ttft_s="2.5", probability="0.5")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["object"], body["model"], body["bid"]) == ("quote", model, "0.100000000")
    assert body["target"] == {"ttft_s": 2.5, "probability": 0.5}
    assert body["based_on"] == {"requests": 90, "window_s": 600.0}
    assert "reason" not in body
    assert ask(gateway, acme.key, model=model, ttft_s="25", probability="0.5").json()["bid"] == (
        "0.010000000"
    )  # 0.01's 21st wait, 21 s; bid 0's, 210 s
    assert ask(gateway, acme.key, model=model, ttft_s="300", probability="0.99").json()["bid"] == (
        "0.000000000"
    )
    missed = ask(gateway, acme.key, model=model, ttft_s="2").json()  # p = 0.9 by default
    assert missed["bid"] is None and missed["target"]["probability"] == 0.9
    assert missed["reason"] == (
        "no recent bid was served within 2 s 90% of the time by a margin clear of chance"
    )
    waits = ask(gateway, acme.key, model=model, bid="0.05").json()["waits"]
    assert waits == {
        "bid": "0.050000000", "bids_from": "0.010000000", "bids_to": "0.010000000",
        "requests": 30, "ttft_p50_s": 15.0, "ttft_p90_s": 27.0, "ttft_p99_s": 30.0,
    }  # fmt: skip


def test_a_quoted_bid_is_0_or_at_least_the_reserve(gateway, acme, quoted_market) -> None:
    """Reserve 0.02: the 0.01 bids bought nothing and count as bid 0. The groups: 0.1 (30
    requests), then 0 (60: waits 1..30 and 10, 20, ..., 300). For p = 0.5 a group of 60 is
    judged by its wait at 0.5 + 2 sqrt(0.25 / 60) = 0.629, the 38th (ceil(37.7)): 33 waits are
    at most 30 s (1..30, and 10, 20, 30 again), then 40, 50, 60, 70, 80: 80 s.

    A quote of 0 under a reserve of 0.02 (issue 48, item 7: "0.000000000" with the reserve at
    0.00365) is the rule, not a slip: bidding nothing already gets there. The API's reference
    says so (docs/api.md, "Budgets, quotes and usage", and the OpenAPI document)."""
    quoted_market.reserve = "0.02"
    quoted_market.save()
    model = quoted_market.served_model
    body = ask(gateway, acme.key, model=model, ttft_s="2.5", probability="0.5").json()
    assert (body["bid"], body["reserve"]) == ("0.100000000", "0.020000000")
    assert ask(gateway, acme.key, model=model, ttft_s="80", probability="0.5").json()["bid"] == (
        "0.000000000"
    )
    assert ask(gateway, acme.key, model=model, ttft_s="79", probability="0.5").json()["bid"] == (
        "0.100000000"
    )
    documented = openapi_document()["components"]["schemas"]["Quote"]["properties"]["bid"]
    description = " ".join(
        s.get("description", "") for s in [documented, *documented.get("anyOf", [])]
    )
    assert "0 or at least the reserve, never between" in description
    assert "0 when bidding nothing already gets there" in description
    operation = openapi_document()["paths"]["/v1/quotes"]["get"]["description"]
    assert "(0 when bidding nothing already gets there, else never below the reserve)" in (
        operation
    )


def test_the_wait_bound_in_force_and_what_a_bid_ranks_as_once_it_has_waited_it(
    gateway, acme, quoted_market
) -> None:
    """The market's bound is on by default, automatic, at 20 s: a request that has waited it
    ranks as if it bid $0.003/s per prompt token more ($3/s per 1,000), reached in the default
    8 steps (mechanism.aging). A bid of 0.01 with a
    30-token prompt then ranks as 0.01 + 0.003 x 30 = 0.1 $/s, among the 0.1 bids, whose 30
    waits 0.1..3.0 s give p50 the 15th (1.5 s), p90 the 27th (2.7 s), p99 the 30th (3.0 s)."""
    model = quoted_market.served_model
    body = ask(gateway, acme.key, model=model, bid="0.01", prompt_tokens="30").json()
    assert body["wait_bound"] == {
        "wait_s": 20.0, "source": "auto", "steps": 8, "credit_per_1k_prompt_tokens": "3.000000000",
    }  # fmt: skip
    assert body["waits"]["ttft_p50_s"] == 15.0  # the bid's own group, as without the bound
    assert body["waits"]["at_bound"] == {
        "after_s": 20.0, "prompt_tokens": 30, "ranks_as": "0.100000000",
        "bids_from": "0.100000000", "bids_to": "0.100000000", "requests": 30,
        "ttft_p50_s": 1.5, "ttft_p90_s": 2.7, "ttft_p99_s": 3.0,
    }  # fmt: skip
    assert "at_bound" not in ask(gateway, acme.key, model=model, bid="0.01").json()["waits"]
    pinned = {"wait_bound_mode": "pinned", "wait_bound_s": 45.0}
    type(quoted_market).objects.filter(pk=quoted_market.pk).update(**pinned)
    caches_clear()  # the gateway keeps a market a few seconds
    body = ask(gateway, acme.key, model=model, bid="0.01", prompt_tokens="30").json()
    assert (body["wait_bound"]["wait_s"], body["wait_bound"]["source"]) == (45.0, "pinned")
    assert body["waits"]["at_bound"]["after_s"] == 45.0
    for off in ({"wait_bound_mode": "off", "wait_bound_s": 0.0}, {"policy": "lpm"}):
        type(quoted_market).objects.filter(pk=quoted_market.pk).update(**off)
        caches_clear()
        body = ask(gateway, acme.key, model=model, bid="0.01", prompt_tokens="30").json()
        assert body["wait_bound"] is None and "at_bound" not in body["waits"], off
    documented = openapi_document()["components"]["schemas"]["QuoteWaitBound"]["properties"]
    assert set(documented) == {"wait_s", "source", "steps", "credit_per_1k_prompt_tokens"}


def test_a_market_without_history_says_why(gateway, acme) -> None:
    market = market_create(engine_url="http://127.0.0.1:9")
    body = ask(gateway, acme.key, model=market.served_model, ttft_s="2").json()
    assert body["bid"] is None
    assert body["reason"] == "too few requests served in the last 600 s to quote (0)"
    assert ask(gateway, acme.key, model=market.served_model, bid="1").json()["waits"] is None


@pytest.mark.parametrize(
    ("query", "status", "param"),
    [
        ({"ttft_s": "2"}, 400, "model"),
        ({"model": "no-such-model", "ttft_s": "2"}, 404, "model"),
        ({"model": "M"}, 400, "ttft_s"),
        ({"model": "M", "ttft_s": "0"}, 422, "ttft_s"),
        ({"model": "M", "ttft_s": "3601"}, 422, "ttft_s"),
        ({"model": "M", "ttft_s": "two"}, 422, "ttft_s"),
        ({"model": "M", "ttft_s": "NaN"}, 422, "ttft_s"),
        ({"model": "M", "ttft_s": "2", "probability": "1"}, 422, "probability"),
        ({"model": "M", "ttft_s": "2", "probability": "-0.5"}, 422, "probability"),
        ({"model": "M", "bid": "-1"}, 422, "bid"),
        ({"model": "M", "ttft_s": "2", "prompt_tokens": "100"}, 400, "prompt_tokens"),
        ({"model": "M", "bid": "0.1", "prompt_tokens": "0"}, 422, "prompt_tokens"),
        ({"model": "M", "bid": "0.1", "prompt_tokens": "1.5"}, 422, "prompt_tokens"),
        ({"model": "M", "bid": "0.1", "prompt_tokens": "lots"}, 422, "prompt_tokens"),
        ({"model": "M", "bid": "0.1", "prompt_tokens": "10000001"}, 422, "prompt_tokens"),
    ],
)
def test_bad_queries_name_the_parameter(gateway, acme, quoted_market, query, status, param):
    if query.get("model") == "M":
        query = {**query, "model": quoted_market.served_model}
    answer = ask(gateway, acme.key, **query)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param


def test_a_quote_needs_an_api_key(gateway, quoted_market) -> None:
    answer = ask(gateway, None, model=quoted_market.served_model, ttft_s="2")
    assert answer.status_code == 401


def test_a_queue_longer_than_the_history_joined_raises_the_quote(
    gateway, acme, monkeypatch
) -> None:
    """Every request of the history joined a queue of 10; the book's two engines hold 15 and
    25 waiting now, 20 each on average: every wait doubles (``mechanism.quotes.queue_scaled``).
    0.1's 21st wait 2.1 s becomes 4.2 s > 2.5 s: nothing buys 2.5 s half the time, 0.1 buys 5 s;
    the waits bid 0.05 buys (the 0.01 group) double: 15, 27, 30 s -> 30, 54, 60 s."""
    market = history_write(acme, queue_len=10)
    model = market.served_model
    assert ask(gateway, acme.key, model=model, ttft_s="2.5", probability="0.5").json()["bid"] == (
        "0.100000000"
    )  # no book yet: the waits as they were
    book_publish(monkeypatch, market, waiting={"sim-a": 15, "sim-b": 25}, now=10.0)
    body = ask(gateway, acme.key, model=model, ttft_s="2.5", probability="0.5").json()
    assert body["bid"] is None
    assert body["reason"] == (
        "no recent bid was served within 2.5 s 50% of the time by a margin clear of chance"
    )
    assert ask(gateway, acme.key, model=model, ttft_s="5", probability="0.5").json()["bid"] == (
        "0.100000000"
    )
    waits = ask(gateway, acme.key, model=model, bid="0.05").json()["waits"]
    assert (waits["ttft_p50_s"], waits["ttft_p90_s"], waits["ttft_p99_s"]) == (30.0, 54.0, 60.0)
    # Shorter than the history's (6 and 4 waiting: 5 each, under 10): no wait shortens.
    book_publish(monkeypatch, market, waiting={"sim-b": 6, "sim-a": 4}, now=20.0)
    assert ask(gateway, acme.key, model=model, ttft_s="2.5", probability="0.5").json()["bid"] == (
        "0.100000000"
    )
