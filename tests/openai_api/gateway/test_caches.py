"""The gateway's caches keyed by client input stay bounded whatever clients send: unknown model
names are not kept, oversized names and keys are refused before any lookup, and a TtlCache
never holds more than its maximum."""

from __future__ import annotations

import time
import uuid
from decimal import Decimal

import httpx
import pytest

from openai_api.gateway import admission, selectors
from openai_api.gateway import keys as gateway_keys
from openai_api.gateway.errors import InvalidApiKey
from openai_api.gateway.selectors import TtlCache
from openai_api.gateway.validation import MAX_MODEL_CHARS
from tests.openai_api.conftest import market_create

HELLO = [{"role": "user", "content": "Hi"}]


def counting(monkeypatch, module, name: str) -> list:
    """Replace ``module.name`` by a wrapper that records each call's kwargs."""
    calls: list = []
    real = getattr(module, name)

    def wrapper(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def test_unknown_model_names_are_not_cached(gateway, acme, transactional_db):
    market = market_create(engine_url="http://127.0.0.1:9")  # never reached: refused first
    with acme.http(gateway) as http:
        for i in range(200):
            name = f"org/unknown-{i}-{uuid.uuid4().hex}" + "x" * 200
            body = {"model": name, "messages": HELLO, "max_tokens": 1}
            assert http.post("/v1/chat/completions", json=body).status_code == 404
        assert len(selectors._markets) == 0
        # A market that exists is cached once, under the name it was asked by.
        body = {"model": market.served_model, "messages": HELLO, "max_tokens": 1, "bid": "-1"}
        http.post("/v1/chat/completions", json=body)  # refused (bid) before any lookup
        assert len(selectors._markets) == 0
    assert selectors.market_for_model(model=market.served_model) == market
    assert selectors.market_for_model(model="org/nope") is None
    assert len(selectors._markets) == 1


def test_an_oversized_model_name_is_refused_before_lookup(gateway, acme, monkeypatch):
    calls = counting(monkeypatch, admission, "market_for_model")
    with acme.http(gateway) as http:
        for length, status in [(MAX_MODEL_CHARS + 1, 422), (2 * 1024 * 1024, 422)]:
            body = {"model": "m" * length, "messages": HELLO}
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code == status, response.text
            assert response.json()["error"]["param"] == "model"
        assert calls == []
        at_limit = {"model": "m" * MAX_MODEL_CHARS, "messages": HELLO}
        assert http.post("/v1/chat/completions", json=at_limit).status_code == 404
    assert [c["model"] for c in calls] == ["m" * MAX_MODEL_CHARS]
    assert len(selectors._markets) == 0


@pytest.mark.parametrize(
    "key",
    [
        "im_0123456789ab_" + "A" * 43 + "A",  # one character more than a key has
        "im_0123456789ab_" + "A" * 10_000,  # (Twisted takes header lines to 16 KiB)
        "im_0123456789ab\x00_" + "A" * 43,
        "im_0123456789AB_" + "A" * 43,  # the prefix is lower-case hex
    ],
)
def test_a_key_not_of_the_keys_form_is_401_without_a_lookup(gateway, acme, monkeypatch, key):
    calls = counting(monkeypatch, gateway_keys, "api_key_authenticate")
    with pytest.raises(InvalidApiKey):
        gateway_keys.api_key_authenticated(key=key)
    assert calls == []
    assert len(gateway_keys._api_keys) == 0
    with httpx.Client(base_url=gateway.url) as http:
        bad = key.replace("\x00", "-")  # a header cannot carry a NUL
        response = http.get("/v1/models", headers={"Authorization": f"Bearer {bad}"})
    assert response.status_code == 401
    assert calls == []
    # The real key still works (and is the only one cached).
    with acme.http(gateway) as http:
        assert http.get("/v1/models").status_code == 200
    assert len(gateway_keys._api_keys) == 1


def test_a_ttl_cache_keeps_its_most_recently_used_entries_only():
    cache: TtlCache[str, int] = TtlCache(ttl_s=lambda: 60.0, max_entries=3)
    for i in range(3):
        cache.put(f"k{i}", i)
    assert cache.get("k0") == (True, 0)  # now the most recently used
    cache.put("k3", 3)  # drops k1, the least recently used
    assert len(cache) == 3
    assert cache.get("k1") == (False, None)
    assert [cache.get(k) for k in ("k0", "k2", "k3")] == [(True, 0), (True, 2), (True, 3)]
    for i in range(1000):
        cache.put(f"flood-{i}", i)
    assert len(cache) == 3
    assert cache.get("flood-999") == (True, 999)


def test_an_expired_entry_is_dropped_when_read():
    ttl = [60.0]
    cache: TtlCache[str, int] = TtlCache(ttl_s=lambda: ttl[0], max_entries=10)
    cache.put("gone", 1)
    cache._entries["gone"] = (0.0, 1)  # expired long ago
    assert cache.get("gone") == (False, None)
    assert len(cache) == 0


@pytest.mark.django_db(transaction=True)
def test_a_new_reserve_a_cut_budget_and_a_revoked_key_take_effect_within_their_caches(
    gateway, acme, sim, settings
):
    """What the hot path caches stops applying on time: a market's reserve within
    GATEWAY_MARKET_CACHE_S, a key's revocation within GATEWAY_API_KEY_CACHE_S, a budget at
    once (the hold reads the budget's row in its own statement, never a cached copy)."""
    from accounts.services import api_key_revoke, budget_set
    from market.models import Market

    settings.GATEWAY_MARKET_CACHE_S = settings.GATEWAY_API_KEY_CACHE_S = 0.5
    market = market_create(engine_url=sim.url)
    body = {"model": market.served_model, "prompt": "Hi", "max_tokens": 1, "bid": "0.001"}
    with acme.http(gateway) as http:
        first = http.post("/v1/completions", json=body)
        assert first.status_code == 200, first.text
        assert first.json()["auction"]["reserve"] == "0.000000000"
        Market.objects.filter(pk=market.pk).update(reserve="0.01")
        time.sleep(0.6)  # past the market's cache: the new reserve is the one applied
        raised = http.post("/v1/completions", json=body)
        assert raised.status_code == 200, raised.text
        auction = raised.json()["auction"]
        assert (auction["reserve"], auction["effective_bid"]) == ("0.010000000", "0.000000000")
        budget_set(tenant=acme.tenant, limit="0.000000001", period="day")
        refused = http.post("/v1/completions", json=body)  # no wait: budgets are not cached
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "insufficient_quota"
        api_key_revoke(api_key=acme.api_key)
        time.sleep(0.6)  # past the key's cache
        revoked = http.post("/v1/completions", json=body)
        assert revoked.status_code == 401, revoked.text


@pytest.mark.django_db(transaction=True)
def test_a_request_needing_no_database_read_is_admitted_without_a_thread_hop(
    gateway, acme, sim, monkeypatch
):
    """Admitting a request whose bid is explicit (or tier flex), once its key and market are
    cached, reads nothing from the database: it is done on the event loop, not handed to a
    database thread. A cold cache, a request for the autobidder and tier priority (a quote)
    go to a thread; each is recorded with its bid either way."""
    from accounts.models import BidSource, Request

    hops: list[str] = []
    real = admission.db_call

    async def counted(fn, /, **kwargs):
        hops.append(fn.__name__)
        return await real(fn, **kwargs)

    monkeypatch.setattr(admission, "db_call", counted)
    market = market_create(engine_url=sim.url)
    asked = {"model": market.served_model, "prompt": "Hi", "max_tokens": 1}
    sent = [  # (body, admitted on a database thread, recorded bid source, bid)
        ({**asked, "bid": "0.001"}, True, BidSource.EXPLICIT, "0.001"),  # nothing cached yet
        ({**asked, "bid": "0.002"}, False, BidSource.EXPLICIT, "0.002"),
        ({**asked, "service_tier": "flex"}, False, BidSource.TIER, "0"),
        ({**asked, "service_tier": "priority"}, True, BidSource.TIER, None),  # the quote's
        (asked, True, BidSource.NONE, "0"),  # the tenant's autobidder is asked: it has none
        ({**asked, "bid": "0.003"}, False, BidSource.EXPLICIT, "0.003"),
    ]
    with acme.http(gateway) as http:
        for body, on_thread, _, _ in sent:
            before = len(hops)
            answer = http.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert hops[before:] == (["request_admit"] if on_thread else []), body
    rows = list(Request.objects.filter(tenant=acme.tenant).order_by("created_at"))
    assert [r.bid_source for r in rows] == [source for _, _, source, _ in sent]
    for row, (_, _, _, bid) in zip(rows, sent, strict=True):
        if bid is not None:
            assert row.bid == Decimal(bid)
