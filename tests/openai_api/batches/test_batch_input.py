"""Checking a batch's input: every bad line named with its number, the whole file refused."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from openai_api.batches.input import BatchInputInvalid, BatchTooLarge, lines_checked


def line(custom_id: str, *, url: str = "/v1/completions", **body) -> str:
    body = {"model": "org/m", "prompt": "Hi", "max_tokens": 2} | body
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def refused(text: str) -> BatchInputInvalid:
    with pytest.raises(BatchInputInvalid) as caught:
        lines_checked(text)
    return caught.value


def test_a_good_file_keeps_line_numbers_and_exact_bids():
    chat = json.dumps(
        {
            "custom_id": "c",
            "url": "/v1/chat/completions",  # method defaults to POST
            "body": {"model": "org/m", "messages": [{"role": "user", "content": "Hi"}]},
        }
    )
    text = "\n".join([line("a", bid=0.25), "", line("b", bid="999999.123456789"), chat]) + "\n"
    checked = lines_checked(text)
    assert [(c.line, c.custom_id, c.url) for c in checked] == [
        (1, "a", "/v1/completions"),
        (3, "b", "/v1/completions"),
        (4, "c", "/v1/chat/completions"),
    ]
    assert checked[0].params.bid == Decimal("0.25")
    assert checked[1].params.bid == Decimal("999999.123456789")
    assert checked[2].params.bid is None and checked[2].params.max_tokens == 256


def test_every_bad_line_is_listed_with_its_number():
    text = "\n".join(
        [
            line("a"),
            "{not json",
            line("b", url="/v1/embeddings"),
            line("a"),  # the custom_id of line 1 again
            line("c", bid=-1),
            line("d", bid="0.1234567891"),  # ten decimal places
            line("e", stream=True),
            json.dumps({"custom_id": "f", "url": "/v1/completions", "body": {"prompt": "x"}}),
            json.dumps({"custom_id": "", "url": "/v1/completions", "body": {}}),
            line("g"),
        ]
    )
    error = refused(text)
    assert error.status == 400  # some lines are malformed, not just unacceptable
    by_line = {e["line"]: e for e in error.lines}
    assert sorted(by_line) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert by_line[2]["code"] == "malformed_request"
    assert by_line[3]["param"] == "url"
    assert "also on line 1" in by_line[4]["message"]
    assert (by_line[5]["param"], by_line[5]["code"]) == ("body.bid", "invalid_value")
    assert by_line[6]["param"] == "body.bid"
    assert by_line[7]["param"] == "body.stream"
    assert by_line[8]["param"] == "body.model"
    assert by_line[9]["param"] == "custom_id"
    body = error.body()["error"]
    assert body["message"].startswith("line 2: ") and "(and 7 more bad lines)" in body["message"]
    assert body["bad_lines"] == 8 and body["code"] == "invalid_batch_input"


def test_only_unacceptable_values_are_a_422():
    error = refused(line("a", max_tokens=0) + "\n" + line("b", temperature=3))
    assert error.status == 422
    assert [(e["line"], e["param"]) for e in error.lines] == [
        (1, "body.max_tokens"),
        (2, "body.temperature"),
    ]


def test_an_empty_file_is_refused():
    with pytest.raises(Exception, match="no lines"):
        lines_checked("\n  \n")


def test_line_and_byte_caps(settings):
    settings.BATCH_MAX_LINES = 2
    with pytest.raises(BatchTooLarge, match="at most 2 lines"):
        lines_checked("\n".join(line(str(i)) for i in range(3)))
    settings.BATCH_MAX_LINES = 10
    settings.BATCH_MAX_BYTES = 50
    with pytest.raises(BatchTooLarge) as caught:
        lines_checked(line("a"))
    assert caught.value.status == 413
