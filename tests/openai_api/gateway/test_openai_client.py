"""The official openai client against the running ASGI server and a real-time simulated engine.

Token counts of the "simple" template are counted by hand: the simulated tokenizer cuts text into
runs of word characters, single punctuation marks and runs of whitespace, so
``<|user|>\\nHello there\\n<|assistant|>\\n`` is 16 tokens:
``< | user | > \\n Hello ␠ there \\n < | assistant | > \\n``.
"""

from __future__ import annotations

import threading
from decimal import Decimal

import openai
import pytest
from django.utils import timezone

from accounts.models import BidSource, ChargeKind, HoldState, Request, RequestStatus
from accounts.services import budget_hold, budget_set
from accounts.services.autobidder import autobidder_configure
from tests.accounts.factories import spend
from tests.openai_api.conftest import market_create
from tests.openai_api.helpers import (
    HELLO,
    entries,
    hold,
    request_id_of,
    request_row,
    token_charge_by_hand,
    token_entry,
    wait_until,
)

HELLO_TOKENS = 16


def test_chat_with_a_bid_in_extra_body(gateway, acme, market):
    client = acme.client(gateway)
    reply = client.chat.completions.create(
        model=market.served_model, messages=HELLO, max_tokens=5, extra_body={"bid": "0.01"}
    )
    assert reply.object == "chat.completion"
    assert reply.model == market.served_model
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "length"
    usage = reply.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (16, 5, 21)
    assert usage.prompt_tokens_details.cached_tokens == 0
    auction = reply.model_extra["auction"]
    # 16 x $3 + 5 x $15 per million = $0.000123
    assert auction["token_charge"] == "0.000123000"
    assert auction["bid"] == "0.010000000"
    assert auction["effective_bid"] == "0.010000000"
    assert auction["reserve"] == "0.000000000"
    assert auction["bid_source"] == "explicit"
    assert (auction["rank"], auction["ahead"]) == (1, 0)  # alone in the queue: first in line
    assert auction["round_id"]
    assert auction["priority_charge"] == "0.000000000"  # nobody else was waiting
    assert auction["priority_charge_capped_by"] is None

    rid = request_id_of(reply.id)
    row = request_row(rid)
    assert (row.status, row.bid, row.bid_source) == (
        RequestStatus.SERVED,
        Decimal("0.01"),
        BidSource.EXPLICIT,
    )
    assert row.request_class == "interactive"
    # The engine's latencies are kept for the tenant's dashboard: first token before the end.
    assert 0 < row.ttft_s <= row.e2e_s
    # Both charges were settled with the answer: the tokens and the engine's priority charge.
    assert sorted((e.kind, e.amount) for e in entries(rid)) == [
        (ChargeKind.PRIORITY, Decimal(0)),
        (ChargeKind.TOKENS, Decimal("0.000123")),
    ]
    placed = hold(rid)
    # The tokens' worst case, 16 x $3 + 5 x $15 per million = $0.000123, plus the priority
    # hold: $0.01/s x the market's hold horizon (1 s, the floor: no history yet) = $0.010123.
    assert placed.amount == Decimal("0.010123")
    # The priority cap, what the tenant consented to, is $0.01/s x 60 s (max_wait_s).
    assert row.priority_cap == Decimal("0.6")
    assert (placed.state, placed.remaining) == (HoldState.SETTLED, Decimal(0))


def test_completion_with_an_x_bid_header_and_request_class(gateway, acme, market):
    client = acme.client(gateway)
    reply = client.completions.create(
        model=market.served_model,
        prompt="Once upon a time",  # 7 tokens: Once ␠ upon ␠ a ␠ time
        max_tokens=3,
        extra_headers={"X-Bid": "0.25", "X-Request-Class": "background"},
    )
    assert reply.object == "text_completion"
    assert reply.choices[0].text
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (7, 3)
    auction = reply.model_extra["auction"]
    assert (auction["bid"], auction["bid_source"]) == ("0.250000000", "explicit")
    # 7 x $3 + 3 x $15 per million = $0.000066
    assert auction["token_charge"] == "0.000066000"
    row = request_row(request_id_of(reply.id))
    assert (row.bid, row.request_class) == (Decimal("0.25"), "background")


def test_completion_by_market_slug_and_token_ids(gateway, acme, market):
    reply = acme.client(gateway).completions.create(
        model=market.slug, prompt=[11, 12, 13, 14], max_tokens=2
    )
    assert reply.model == market.served_model
    assert reply.usage.prompt_tokens == 4
    # 4 x $3 + 2 x $15 per million = $0.000042
    assert reply.model_extra["auction"]["token_charge"] == "0.000042000"


def test_chat_stream_with_usage(gateway, acme, market):
    stream = acme.client(gateway).chat.completions.create(
        model=market.served_model,
        messages=HELLO,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"bid": 0.5},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    last = chunks[-1]
    assert last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (HELLO_TOKENS, 4)
    assert last.usage.prompt_tokens_details.cached_tokens == 0
    auction = last.model_extra["auction"]
    # 16 x $3 + 4 x $15 per million = $0.000108
    assert auction["token_charge"] == "0.000108000"
    assert auction["bid"] == "0.500000000"
    rid = request_id_of(last.id)
    assert token_entry(rid).amount == Decimal("0.000108")
    # Settled with its answer: both charges written, the hold closed.
    assert (hold(rid).state, hold(rid).remaining) == (HoldState.SETTLED, Decimal(0))


def test_completion_stream_without_usage_still_ends_with_the_auction(gateway, acme, market):
    stream = acme.client(gateway).completions.create(
        model=market.served_model, prompt="Hi", max_tokens=3, stream=True
    )
    chunks = list(stream)
    assert all(c.usage is None for c in chunks)
    last = chunks[-1]
    assert last.choices[0].finish_reason == "length"
    auction = last.model_extra["auction"]
    assert auction["bid_source"] == "none"
    # 1 x $3 + 3 x $15 per million = $0.000048
    assert auction["token_charge"] == "0.000048000"
    # Charged once: its tokens and its priority (0: no bid), both with the answer.
    kinds = sorted(e.kind for e in entries(request_id_of(last.id)))
    assert kinds == [ChargeKind.PRIORITY, ChargeKind.TOKENS]


def test_a_second_identical_prompt_is_cached_and_charged_at_the_cached_price(gateway, acme, market):
    client = acme.client(gateway)
    # 11 tokens a sentence (The ␠ market ␠ clears ␠ every ␠ round . ␠): 220
    long_prompt = "The market clears every round. " * 20
    first = client.completions.create(model=market.served_model, prompt=long_prompt, max_tokens=1)
    second = client.completions.create(model=market.served_model, prompt=long_prompt, max_tokens=1)
    assert first.usage.prompt_tokens == second.usage.prompt_tokens == 220
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    expected = token_charge_by_hand(prompt=220, cached=cached, completion=1)
    assert Decimal(second.model_extra["auction"]["token_charge"]) == expected
    assert token_entry(request_id_of(second.id)).amount == expected


def test_autobidder_bids_when_the_request_has_no_bid(gateway, acme, market):
    autobidder_configure(
        tenant=acme.tenant,
        enabled=True,
        budget="10",
        period="day",
        values={"interactive": "0.05"},
        max_wait_s=30.0,
    )
    reply = acme.client(gateway).chat.completions.create(
        model=market.served_model, messages=HELLO, max_tokens=2
    )
    auction = reply.model_extra["auction"]
    # mu = 0 and $10 left: the bid is the class's value, $0.05/s (10 / 30 s caps it at $0.33/s)
    assert (auction["bid"], auction["bid_source"]) == ("0.050000000", "autobid")
    rid = request_id_of(reply.id)
    assert request_row(rid).bid_source == BidSource.AUTOBID
    # 16 x $3 + 2 x $15 per million + $0.05/s x the hold horizon (1 s) = $0.050078; the
    # priority cap, the autobid's worst case, is $0.05/s x 30 s = $1.5.
    assert hold(rid).amount == Decimal("0.050078")
    assert request_row(rid).priority_cap == Decimal("1.5")


def test_no_bid_and_no_autobidder_bids_zero(gateway, acme, market):
    reply = acme.client(gateway).chat.completions.create(
        model=market.served_model, messages=HELLO, max_tokens=1
    )
    auction = reply.model_extra["auction"]
    assert (auction["bid"], auction["bid_source"], auction["priority_charge"]) == (
        "0.000000000",
        "none",
        "0.000000000",
    )
    # 16 x $3 + 1 x $15 per million; no priority part
    assert hold(request_id_of(reply.id)).amount == Decimal("0.000063")
    assert request_row(request_id_of(reply.id)).priority_cap == 0


def test_a_bid_under_the_reserve_buys_no_priority(gateway, acme, start_sim, transactional_db):
    sim = start_sim(reserve=0.1)
    market = market_create(engine_url=sim.url, reserve="0.1")
    reply = acme.client(gateway).chat.completions.create(
        model=market.served_model, messages=HELLO, max_tokens=1, extra_body={"bid": "0.05"}
    )
    auction = reply.model_extra["auction"]
    assert (auction["bid"], auction["effective_bid"], auction["reserve"]) == (
        "0.050000000",
        "0.000000000",
        "0.100000000",
    )
    assert auction["priority_charge"] == "0.000000000"
    # no priority part is held for a bid that buys none: 16 x $3 + 1 x $15 per million
    assert hold(request_id_of(reply.id)).amount == Decimal("0.000063")


def test_a_winning_bid_under_contention_pays_and_a_zero_bid_does_not(
    gateway, acme, start_sim, transactional_db
):
    # One request per prefill step (a 300-token prompt fills the step) of ~0.3 s: a queue.
    sim = start_sim(
        speed=1.0,
        settings=["max_prefill_tokens=400", "chunked_prefill_size=400", "prefill_token_s=1e-3"],
    )
    market = market_create(engine_url=sim.url)
    results: dict[str, object] = {}

    def send(name: str, bid: str) -> None:
        client = acme.client(gateway)
        prompt = f"{name} " + "words of a long document " * 60  # distinct first token each
        results[name] = client.completions.create(
            model=market.served_model, prompt=prompt, max_tokens=2, extra_body={"bid": bid}
        )

    threads = [threading.Thread(target=send, args=(f"low{i}", "0.001")) for i in range(4)]
    threads.append(threading.Thread(target=send, args=("zero", "0")))
    for t in threads:
        t.start()
    wait_until(lambda: len(sim.call(lambda: list(sim.server.engine.waiting))) >= 3)
    winner = threading.Thread(target=send, args=("winner", "1"))
    winner.start()
    for t in [*threads, winner]:
        t.join(timeout=30)
    won = results["winner"].model_extra["auction"]
    assert (won["rank"], won["ahead"]) == (1, 0)  # its bid put it first in line at once
    charge = Decimal(won["priority_charge"])
    # it jumped ahead of requests bidding $0.001/s: it pays for their delay, less than its bid
    # times the whole run of the queue (60 s is far more than it waited)
    assert Decimal(0) < charge < Decimal(1) * 60
    assert results["zero"].model_extra["auction"]["priority_charge"] == "0.000000000"


def test_models_lists_the_active_markets(gateway, acme, market, transactional_db):
    market_create(engine_url=market.engine_url, slug="closed-market")
    from market.models import Market

    Market.objects.filter(slug="closed-market").update(is_active=False)
    listed = {m.id: m for m in acme.client(gateway).models.list()}
    assert market.served_model in listed
    assert "org/closed-market" not in listed
    assert listed[market.served_model].model_extra["market"] == market.slug


def test_an_exhausted_key_raises_rate_limit_error_insufficient_quota_and_is_not_retried(
    gateway, acme, market, settings
):
    settings.METRICS_TOKEN = "scrape-token"
    now = timezone.now()
    budget_set(tenant=acme.tenant, api_key=acme.api_key, limit="0.001", period="day")
    spend(tenant=acme.tenant, market=market, request_id="spent", charge=0.0004, at=now,
          api_key=acme.api_key)  # fmt: skip
    budget_hold(tenant=acme.tenant, api_key=acme.api_key, request_id="in-flight",
                amount="0.0003", now=now)  # fmt: skip
    sent: list[object] = []
    client = openai.OpenAI(
        base_url=f"{gateway.url}/v1",
        api_key=acme.key,
        max_retries=2,  # the client's default: it retries a 429 unless told not to
        timeout=30,
        http_client=openai.DefaultHttpxClient(event_hooks={"request": [sent.append]}),
    )
    with pytest.raises(openai.RateLimitError) as caught:
        # 16 x $3 + 20 x $15 per million = $0.000348 > 0.001 - 0.0004 - 0.0003 = $0.0003 left
        client.chat.completions.create(model=market.served_model, messages=HELLO, max_tokens=20)
    assert len(sent) == 1  # x-should-retry: false, obeyed
    error = caught.value
    assert (error.status_code, error.code, error.type) == (
        429,
        "insufficient_quota",
        "insufficient_quota",
    )
    assert error.body["message"].startswith(
        "This request's hold, up to $0.000348, is more than the $0.0003 left of this API key's "
        "budget of $0.001 per day ($0.0004 spent, $0.0003 held for requests in flight). The "
        "hold is the prompt and max_tokens at the market's prices plus the bid times the "
        "market's hold horizon: lower the bid or max_tokens, or raise the budget. It resets at "
    )
    assert (error.body["budget"]["reason"], error.body["budget"]["remaining"]) == (
        "exceeds_remaining",
        "0.000300000",
    )
    assert Request.objects.filter(tenant=acme.tenant).count() == 1  # "spent"'s, no other
    with acme.http(gateway) as http:
        text = http.get("/metrics", headers={"Authorization": "Bearer scrape-token"}).text
    # Refused at admission, before a market is known: market "-".
    assert 'endpoint="chat",error="insufficient_quota",market="-",status="429"' in text


def test_metrics_count_requests_ttft_and_charges(gateway, acme, market, settings):
    settings.METRICS_TOKEN = "scrape-token"
    acme.client(gateway).chat.completions.create(
        model=market.served_model, messages=HELLO, max_tokens=1, extra_body={"bid": "0.01"}
    )
    with acme.http(gateway) as http:
        http.post("/v1/chat/completions", json={"model": "nope", "messages": HELLO})
        text = http.get("/metrics", headers={"Authorization": "Bearer scrape-token"}).text
    slug = market.slug
    assert f'gateway_requests_total{{endpoint="chat",market="{slug}",status="200"}} 1.0' in text
    assert 'error="model_not_found"' in text
    assert f'gateway_engine_ttft_seconds_count{{market="{slug}"}} 1.0' in text
    assert f'gateway_bids_dollars_per_second_count{{bid_source="explicit",market="{slug}"}}' in text
    # 16 x $3 + 1 x $15 per million = $0.000063
    assert f'gateway_token_charges_dollars_total{{market="{slug}"}} 6.3e-05' in text
    assert f'gateway_requests_in_flight{{market="{slug}"}} 0.0' in text
