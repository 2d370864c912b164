"""The bid's carrier in the engine contract: the rid (``<request id>~bid=<$/s>``), and
``custom_params.bid`` for a client talking to one engine directly. Hand-written cases."""

from __future__ import annotations

import pytest

from scheduler_bridge.contract.wire import (
    BID_PATH,
    BidError,
    auction_value,
    bid_read,
    rid_owner,
    rid_read,
    rid_request_id,
    rid_with_bid,
)


@pytest.mark.parametrize(
    ("request_id", "bid", "rid"),
    [
        ("gw-1", 0.25, "gw-1~bid=0.25"),
        ("gw-1", 0, "gw-1~bid=0.0"),
        ("a~b", 1e-05, "a~b~bid=1e-05"),
        ("x", 3.0, "x~bid=3.0"),
    ],
)
def test_a_rid_carries_the_id_and_the_bid_and_reads_back(request_id, bid, rid) -> None:
    assert rid_with_bid(request_id, bid) == rid
    assert rid_read(rid) == (request_id, float(bid))
    assert rid_request_id(rid) == request_id


@pytest.mark.parametrize(
    ("request_id", "owner", "rid"),
    [
        ("gw-1", "17", "gw-1~t=17~bid=0.5"),
        ("a~b", "acme_2", "a~b~t=acme_2~bid=0.5"),
        ("gw-1", "", "gw-1~bid=0.5"),
    ],
)
def test_a_rid_carries_the_tenant_tag_beside_the_bid(request_id, owner, rid) -> None:
    assert rid_with_bid(request_id, 0.5, owner) == rid
    assert rid_read(rid) == (request_id, 0.5)
    assert rid_request_id(rid) == request_id
    assert rid_owner(rid) == owner
    assert bid_read(rid, None) == (request_id, 0.5)


def test_a_bad_tenant_tag_is_refused_and_a_stray_mark_is_part_of_the_id() -> None:
    for bad in ("a b", "x~y", "t" * 65):
        with pytest.raises(ValueError, match="tenant tag"):
            rid_with_bid("r", 0.5, bad)
    with pytest.raises(ValueError, match="request id"):
        rid_with_bid("r~t=1", 0.5)
    # Not a tag (empty, or characters a tag cannot have): the id keeps it, no tenant.
    assert rid_read("r~t=~bid=0.5") == ("r~t=", 0.5)
    assert rid_owner("r~t=a.b~bid=0.5") == ""
    assert rid_owner("plain") == ""


def test_floats_round_trip_exactly() -> None:
    for bid in (0.1, 0.30000000000000004, 123.456789012345, 5e-324 * 1e300):
        assert rid_read(rid_with_bid("r", bid))[1] == bid


def test_a_rid_without_the_mark_is_the_id_and_no_bid() -> None:
    assert rid_read("plain-uuid") == ("plain-uuid", None)
    assert rid_request_id("plain-uuid") == "plain-uuid"


@pytest.mark.parametrize(
    "rid", ["r~bid=", "r~bid=x", "r~bid=-1.0", "r~bid=+1", "r~bid=1,5", "r~bid=inf", "~bid=1.0",
            "r~bid=0.5 ", "r~bid=1e7"],
)  # fmt: skip
def test_a_mangled_bid_in_the_rid_is_an_error_naming_the_rid(rid) -> None:
    with pytest.raises(BidError) as caught:
        rid_read(rid)
    assert caught.value.param == "rid"


def test_a_request_id_cannot_hold_the_mark() -> None:
    with pytest.raises(ValueError):
        rid_with_bid("a~bid=1", 0.5)
    with pytest.raises(ValueError):
        rid_with_bid("", 0.5)


@pytest.mark.parametrize(
    ("rid", "custom", "expected"),
    [
        ("r", None, ("r", 0.0)),  # neither: 0
        ("r", {}, ("r", 0.0)),
        ("r~bid=0.5", None, ("r", 0.5)),  # the router's way
        ("r", {"bid": 0.5}, ("r", 0.5)),  # a direct client's way
        ("r~bid=0.5", {"bid": 0.5}, ("r", 0.5)),  # both, agreeing
        ("r~bid=0.5", {"bid": 1}, None),  # both, disagreeing
        ("r", {"bid": "0.5"}, None),
        ("r", [], None),
    ],
)
def test_bid_read_is_the_one_reading(rid, custom, expected) -> None:
    if expected is None:
        with pytest.raises(BidError) as caught:
            bid_read(rid, custom)
        assert caught.value.param in (BID_PATH, "sampling_params.custom_params")
    else:
        assert bid_read(rid, custom) == expected


def test_auction_values_read_both_engines_shapes() -> None:
    assert auction_value({"charge": 0.5}, "charge") == 0.5  # the simulated engine
    assert auction_value({"charge": [0.5]}, "charge") == 0.5  # SGLang's customized_info
    assert auction_value({"charge": []}, "charge") is None
    assert auction_value({}, "charge") is None


def test_the_simulated_engine_reads_the_tenant_tag_from_the_rid() -> None:
    from engines.sim.protocol import parse_generate

    got = parse_generate(
        {"rid": "gw-9~t=42~bid=0.5", "text": "hi", "sampling_params": {"max_new_tokens": 1}}
    )
    assert (got.rid, got.bid, got.owner) == ("gw-9", 0.5, "42")
    got = parse_generate({"rid": "gw-9", "text": "hi", "sampling_params": {"max_new_tokens": 1}})
    assert (got.rid, got.bid, got.owner) == ("gw-9", 0.0, "")
