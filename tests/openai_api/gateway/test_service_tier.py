"""OpenAI's ``service_tier`` through the official client: ``flex`` bids nothing, ``priority``
bids the market's quote for its priority target (never above the tenant's cap), ``auto`` and
``default`` keep the tenant's default; an explicit bid wins; the answer echoes the tier used;
anything else is a 400 naming the field."""

from __future__ import annotations

from decimal import Decimal

import httpx
import openai
import pytest
from django.utils import timezone

from accounts.models import BidSource
from accounts.services import request_open, request_settle
from openai_api.gateway.keys import api_key_cache_clear
from openai_api.gateway.selectors import caches_clear
from tests.openai_api.helpers import HELLO, request_id_of, request_row


def _history(program, market, *, bid: str, waits: list[float], tag: str) -> None:
    """Served requests of ``market`` that bid ``bid`` and waited ``waits`` (seconds)."""
    now = timezone.now()
    for n, ttft_s in enumerate(waits):
        rid = f"{tag}-{n}"
        request_open(request_id=rid, tenant=program.tenant, api_key=program.api_key,
                     market=market, bid=bid, hold_amount="0.01", now=now)  # fmt: skip
        request_settle(request_id=rid, prompt_tokens=10, cached_tokens=0, completion_tokens=2,
                       ttft_s=ttft_s, e2e_s=ttft_s, now=now)  # fmt: skip


def _chat(program, gateway, market, **kwargs):
    client = program.client(gateway)
    return client.chat.completions.create(
        model=market.served_model, messages=HELLO, max_tokens=3, **kwargs
    )


def test_flex_bids_nothing_and_is_echoed(gateway, acme, market):
    reply = _chat(acme, gateway, market, service_tier="flex")
    assert reply.service_tier == "flex"
    auction = reply.model_extra["auction"]
    assert (auction["bid"], auction["bid_source"]) == ("0.000000000", "tier")
    assert auction["priority_charge"] == "0.000000000"
    row = request_row(request_id_of(reply.id))
    assert (row.bid, row.bid_source, row.priority_cap) == (0, BidSource.TIER, 0)


def test_priority_bids_the_quote_for_the_markets_target_under_the_tenants_cap(
    gateway, acme, market
):
    """The market's target: a first token within 25 s half the time. History: 30 requests bid
    0.005 and waited 1..30 s (the wait a quote for half the time reads, the 21st of 30: 21 s,
    met), 30 bid nothing and waited 100..3000 s (2100 s: missed), so the quote is 0.005, under
    acme's cap (0.01 by default)."""
    market.priority_ttft_s, market.priority_probability = 25.0, 0.5
    market.save()
    caches_clear()
    _history(acme, market, bid="0.005", waits=[float(i) for i in range(1, 31)], tag="hi")
    _history(acme, market, bid="0", waits=[100.0 * i for i in range(1, 31)], tag="lo")
    reply = _chat(acme, gateway, market, service_tier="priority")
    assert reply.service_tier == "priority"
    auction = reply.model_extra["auction"]
    assert (auction["bid"], auction["bid_source"]) == ("0.005000000", "tier")
    # The tenant's cap bounds it: 0.002 < 0.005.
    acme.tenant.priority_bid_cap = Decimal("0.002")
    acme.tenant.save()
    api_key_cache_clear()  # the key's tenant, as the gateway caches it, is read again
    reply = _chat(acme, gateway, market, service_tier="priority")
    assert reply.model_extra["auction"]["bid"] == "0.002000000"


def test_priority_without_a_quote_bids_the_tenants_cap(gateway, acme, market):
    reply = _chat(acme, gateway, market, service_tier="priority")
    assert reply.service_tier == "priority"
    assert reply.model_extra["auction"]["bid"] == "0.010000000"  # the default cap
    assert request_row(request_id_of(reply.id)).bid_source == BidSource.TIER


def test_an_explicit_bid_wins_over_the_tier(gateway, acme, market):
    reply = _chat(acme, gateway, market, service_tier="priority", extra_body={"bid": "0.003"})
    assert reply.service_tier == "default"
    auction = reply.model_extra["auction"]
    assert (auction["bid"], auction["bid_source"]) == ("0.003000000", "explicit")


@pytest.mark.parametrize("tier", ["auto", "default", None])
def test_auto_and_default_keep_the_tenants_default(gateway, acme, market, tier):
    kwargs = {} if tier is None else {"service_tier": tier}
    reply = _chat(acme, gateway, market, **kwargs)
    assert reply.service_tier == "default"
    assert reply.model_extra["auction"]["bid_source"] == "none"  # no bid, no autobidder


def test_a_streamed_answer_echoes_the_tier_in_every_chunk(gateway, acme, market):
    client = acme.client(gateway)
    chunks = list(
        client.chat.completions.create(
            model=market.served_model, messages=HELLO, max_tokens=3, stream=True,
            service_tier="flex",
        )
    )  # fmt: skip
    assert chunks and {c.service_tier for c in chunks} == {"flex"}


@pytest.mark.parametrize("tier", ["bogus", "Priority", "scale", 3])
def test_another_tier_is_a_400_naming_the_field(gateway, acme, market, tier):
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": market.served_model, "messages": HELLO, "service_tier": tier},
        headers={"Authorization": f"Bearer {acme.key}"},
        timeout=30,
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "service_tier"
    with pytest.raises(openai.BadRequestError):
        _chat(acme, gateway, market, service_tier="bogus")
