"""An autobidder class with a latency target through the gateway: the gateway quotes the target
in the request's market (the rule of ``GET /v1/quotes`` and tier ``priority``, under the
tenant's cap) and the autobidder bids that quote / (1 + mu) as it would a value."""

from __future__ import annotations

from decimal import Decimal

from accounts.models import Autobidder, BidSource
from accounts.services.autobidder import autobidder_configure
from tests.openai_api.gateway.test_service_tier import _chat, _history
from tests.openai_api.helpers import request_id_of, request_row


def _autobidder(program) -> None:
    """Budget $100 a day (never binding here: 100 / 10 s = 10 $/s), mu = 1: every class is
    bid at half of what it is worth."""
    autobidder_configure(
        tenant=program.tenant,
        enabled=True,
        budget="100",
        period="day",
        values={
            "chat": {"ttft_s": 25, "p": 0.5},
            "strict": {"ttft_s": 25, "p": 0.9},
            "batch": "0.004",
        },
        max_wait_s=10.0,
    )
    Autobidder.objects.filter(tenant=program.tenant).update(mu=1.0)


def test_a_target_class_bids_the_markets_quote_after_mu(gateway, acme, market):
    """History: 30 requests bid 0.005 and waited 1..30 s, 30 bid nothing and waited
    100..3000 s. Groups of at least 20 from the highest bid: {0.005 x 30} then {0 x 30}.
    "chat" (25 s at p 0.5): a group of 30 is judged by its 21st wait (``mechanism.quotes``'
    confident median, 0.5 + 2 sqrt(0.25 / 30) = 0.683 of 30), 21 s <= 25; the second's 2100 s >
    25: the quote is the first group's median bid, 0.005, under acme's cap 0.01, bid as 0.005 /
    (1 + 1) = 0.0025; its consent cap 0.0025 x 10 s. "strict" (p 0.9): the first group's 30th
    wait, 30 s > 25, so nothing is quoted and the class is worth the cap, 0.01, bid 0.005. The
    value class "batch": 0.004 / 2 = 0.002."""
    _history(acme, market, bid="0.005", waits=[float(i) for i in range(1, 31)], tag="hi")
    _history(acme, market, bid="0", waits=[100.0 * i for i in range(1, 31)], tag="lo")
    _autobidder(acme)
    for request_class, bid, cap in (
        ("chat", "0.002500000", Decimal("0.025")),
        ("strict", "0.005000000", Decimal("0.05")),
        ("batch", "0.002000000", Decimal("0.02")),
    ):
        reply = _chat(acme, gateway, market, extra_body={"request_class": request_class})
        auction = reply.model_extra["auction"]
        assert (auction["bid"], auction["bid_source"]) == (bid, "autobid"), request_class
        row = request_row(request_id_of(reply.id))
        assert (row.bid_source, row.priority_cap) == (BidSource.AUTOBID, cap), request_class


def test_without_history_a_target_class_is_worth_the_tenants_cap(gateway, acme, market):
    """Too few requests to quote: like tier priority, the cap (0.01), here bid 0.01 / 2."""
    _autobidder(acme)
    reply = _chat(acme, gateway, market, extra_body={"request_class": "chat"})
    assert reply.model_extra["auction"]["bid"] == "0.005000000"
