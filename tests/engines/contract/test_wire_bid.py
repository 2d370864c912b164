"""The bid's place in the engine contract: ``sampling_params.custom_params``, the bid ($/s) and
the tenant's tag as fields, written by ``auction_params`` and read by ``auction_read`` (both
engines' one reading). Hand-written cases."""

from __future__ import annotations

import json

import pytest

from engines.contract.wire import (
    BID_PATH,
    PARAMS_PATH,
    TENANT_PATH,
    AuctionParams,
    BidError,
    auction_params,
    auction_read,
    auction_value,
)


@pytest.mark.parametrize(
    ("bid", "owner", "params"),
    [
        (0.25, "", {"bid": 0.25}),
        (0, "", {"bid": 0.0}),
        (1e-05, "17", {"bid": 1e-05, "tenant": "17"}),
        (3, "acme_2", {"bid": 3.0, "tenant": "acme_2"}),
    ],
)
def test_the_fields_carry_the_bid_and_the_tenant_and_read_back(bid, owner, params) -> None:
    assert auction_params(bid=bid, owner=owner, request_id="r") == params
    assert auction_read(params, request_id="r") == AuctionParams(float(bid), owner)


def test_floats_round_trip_exactly_through_json() -> None:
    for bid in (0.1, 0.30000000000000004, 123.456789012345, 5e-324 * 1e300):
        sent = json.loads(json.dumps(auction_params(bid=bid, request_id="r")))
        assert auction_read(sent, request_id="r").bid == bid


def test_what_an_engine_would_refuse_is_not_sent() -> None:
    for bad in ("a b", "x~y", "a.b", "t" * 65):
        with pytest.raises(ValueError, match="tenant tag"):
            auction_params(bid=0.5, owner=bad, request_id="r")
    for bid in (-1.0, float("nan"), float("inf"), 1e7):
        with pytest.raises(ValueError, match="'r'"):
            auction_params(bid=bid, request_id="r")


@pytest.mark.parametrize(
    ("custom", "expected"),
    [
        (None, AuctionParams(0.0, "")),  # no custom_params: a client that does not bid
        ({}, AuctionParams(0.0, "")),
        ({"bid": None}, AuctionParams(0.0, "")),
        ({"temperature_hint": 3}, AuctionParams(0.0, "")),  # not the market's: left alone
        ({"bid": 0.5, "other": "x"}, AuctionParams(0.5, "")),
        ({"bid": 2, "tenant": "acme_2"}, AuctionParams(2.0, "acme_2")),
        ({"tenant": "7"}, AuctionParams(0.0, "7")),
    ],
)
def test_auction_read_is_the_one_reading(custom, expected) -> None:
    assert auction_read(custom, request_id="r") == expected


@pytest.mark.parametrize(
    ("custom", "param"),
    [
        ([], PARAMS_PATH),
        ("bid=0.5", PARAMS_PATH),
        ({"bid": "0.5"}, BID_PATH),  # a number, not its text
        ({"bid": True}, BID_PATH),
        ({"bid": -0.000001}, BID_PATH),
        ({"bid": float("nan")}, BID_PATH),
        ({"bid": 1e7}, BID_PATH),  # above the maximum bid
        ({"bid": 0.5, "tenant": ""}, TENANT_PATH),
        ({"bid": 0.5, "tenant": "a.b"}, TENANT_PATH),
        ({"bid": 0.5, "tenant": 17}, TENANT_PATH),
        ({"bid": 0.5, "tenant": "t" * 65}, TENANT_PATH),
    ],
)
def test_a_bad_field_is_an_error_naming_it(custom, param) -> None:
    with pytest.raises(BidError) as caught:
        auction_read(custom, request_id="r")
    assert caught.value.param == param
    assert param in str(caught.value)


def test_auction_values_read_both_engines_shapes() -> None:
    assert auction_value({"charge": 0.5}, "charge") == 0.5  # the simulated engine
    assert auction_value({"charge": [0.5]}, "charge") == 0.5  # SGLang's customized_info
    assert auction_value({"charge": []}, "charge") is None
    assert auction_value({}, "charge") is None


def test_the_simulated_engine_reads_the_fields_and_takes_the_rid_as_the_id() -> None:
    from engines.sim.protocol import parse_generate

    custom = {"bid": 0.5, "tenant": "42"}
    got = parse_generate(
        {
            "rid": "gw-9",
            "text": "hi",
            "sampling_params": {"max_new_tokens": 1, "custom_params": custom},
        }
    )
    assert (got.rid, got.bid, got.owner) == ("gw-9", 0.5, "42")
    got = parse_generate(
        {"rid": "gw-9~t=4", "text": "hi", "sampling_params": {"max_new_tokens": 1}}
    )
    assert (got.rid, got.bid, got.owner) == ("gw-9~t=4", 0.0, "")
