"""Bids, bodies and chat templates, checked without a server."""

from __future__ import annotations

import sys
import types
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accounts.money import money_str
from market.models import SIMPLE_CHAT_TEMPLATE
from openai_api.gateway.chat_templates import (
    HuggingFaceTemplate,
    TemplateUnavailable,
    _hugging_face,
    chat_template,
    chat_template_loaded,
)
from openai_api.gateway.errors import InvalidValue, MalformedRequest
from openai_api.gateway.refusals import body_parsed
from openai_api.gateway.validation import CHAT, COMPLETIONS, Message, bid_parsed, completion_params


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, Decimal(0)),
        ("0", Decimal(0)),
        (Decimal("0.25"), Decimal("0.25")),
        ("  1.5 ", Decimal("1.5")),
        ("1e-9", Decimal("1E-9")),
        ("0.100000000000", Decimal("0.1")),  # trailing zeros are not places of value
        (1000000, Decimal(1000000)),
        ("1E+6", Decimal(1000000)),
    ],
)
def test_good_bids(value, expected):
    assert bid_parsed(value, param="bid") == expected


@pytest.mark.parametrize(
    "value",
    ["-1", "-0.000000001", "NaN", "sNaN", "Infinity", "-inf", "1e-10", "0.0000000015",
     "1000000.000000001", "1e7", "", "abc", "0x10", "1,5", Decimal("NaN")],
)  # fmt: skip
def test_bad_bid_values_are_422(value):
    with pytest.raises(InvalidValue) as caught:
        bid_parsed(value, param="X-Bid")
    assert caught.value.param == "X-Bid"


@pytest.mark.parametrize("value", [True, False, [1], {"bid": 1}])
def test_bad_bid_types_are_400(value):
    with pytest.raises(MalformedRequest):
        bid_parsed(value, param="bid")


@given(st.decimals(min_value=0, max_value=1_000_000, places=9))
def test_every_bid_of_nine_places_in_range_is_kept_exactly(bid):
    assert bid_parsed(str(bid), param="bid") == bid


def test_json_numbers_keep_their_digits():
    body = body_parsed(b'{"bid": 0.1, "temperature": 0.7, "max_tokens": 3}')
    assert body["bid"] == Decimal("0.1")  # not 0.1000000000000000055...
    assert body["max_tokens"] == 3


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff", b"[]", b"1", b"[" * 100_000, b"9" * 5000])
def test_bodies_that_are_not_objects_are_400(raw):
    with pytest.raises(MalformedRequest):
        body_parsed(raw)


def test_chat_params_defaults_and_headers():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    body |= {"temperature": Decimal("0.5"), "stop": "x"}
    params = completion_params(body, endpoint=CHAT, headers={"x-bid": "0.3"})
    assert params.messages == (Message("user", "ab"),)
    assert (params.max_tokens, params.stream, params.request_class) == (256, False, "interactive")
    assert params.bid == Decimal("0.3")
    assert params.sampling == {"temperature": 0.5, "stop": ["x"]}


def test_completion_params_prompts():
    ids = completion_params({"model": "m", "prompt": [[1, 2]]}, endpoint=COMPLETIONS, headers={})
    assert (ids.prompt_ids, ids.max_tokens) == ((1, 2), 16)
    one = completion_params({"model": "m", "prompt": ["hi"]}, endpoint=COMPLETIONS, headers={})
    assert one.prompt_text == "hi"
    with pytest.raises(InvalidValue):
        completion_params({"model": "m", "prompt": ["a", "b"]}, endpoint=COMPLETIONS, headers={})


def test_same_bid_in_body_and_header_is_fine():
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "bid": "0.50"}
    params = completion_params(body, endpoint=CHAT, headers={"x-bid": "0.5"})
    assert params.bid == Decimal("0.5")


def test_simple_template_counts_like_the_simulated_engine():
    prompt = chat_template("simple").chat([Message("system", "Be brief."), Message("user", "Hi")])
    assert prompt.text == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
    # (< | system | > \n) (Be ␠ brief . \n) (< | user | > \n) (Hi \n) (< | assistant | > \n)
    assert prompt.tokens == 6 + 5 + 6 + 2 + 6
    assert prompt.input_ids is None


def test_hugging_face_template_is_loaded_lazily_and_sends_token_ids(monkeypatch):
    class FakeTokenizer:
        def apply_chat_template(self, conversation, tokenize, add_generation_prompt):
            assert tokenize and add_generation_prompt
            return [100 + len(m["content"]) for m in conversation] + [7]

        def encode(self, text):
            return [1, *range(len(text))]

    fake = types.ModuleType("transformers")
    fake.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda name: FakeTokenizer())
    monkeypatch.setitem(sys.modules, "transformers", fake)
    _hugging_face.cache_clear()
    try:
        template = chat_template("org/real-model")
        assert isinstance(template, HuggingFaceTemplate)
        prompt = template.chat([Message("user", "abc")])
        assert (prompt.text, prompt.input_ids, prompt.tokens) == (None, [103, 7], 2)
        assert template.text("hey").input_ids == [1, 0, 1, 2]
    finally:
        _hugging_face.cache_clear()


def test_hugging_face_template_without_transformers_is_503(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    _hugging_face.cache_clear()
    with pytest.raises(TemplateUnavailable) as caught:
        chat_template("org/real-model")
    assert caught.value.status == 503


def test_a_template_counts_as_loaded_only_once_it_loaded(monkeypatch):
    """The gateway admits a request on its event loop only when the market's template needs
    no loading: the simple one always, a Hugging Face one after it loaded, never one whose
    load failed (each request would try again, on the loop)."""
    assert chat_template_loaded(SIMPLE_CHAT_TEMPLATE)
    monkeypatch.setitem(sys.modules, "transformers", None)
    _hugging_face.cache_clear()
    with pytest.raises(TemplateUnavailable):
        chat_template("org/unloadable")
    assert not chat_template_loaded("org/unloadable")
    fake = types.ModuleType("transformers")
    fake.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda name: object())
    monkeypatch.setitem(sys.modules, "transformers", fake)
    assert not chat_template_loaded("org/loads")
    try:
        chat_template("org/loads")
        assert chat_template_loaded("org/loads")
    finally:
        _hugging_face.cache_clear()


@pytest.mark.parametrize(
    "value",
    ["1_0", "1_000", "٣", "١٠", "１", "１０", "𝟏", "۵", "٠.٥", "+1", ".5", "1.", "1 0", "\u20031",
     "1\x00", "0.1\ud800", "1e", "1e+", "--1"],
)  # fmt: skip
@pytest.mark.parametrize("param", ["bid", "X-Bid"])
def test_bids_written_as_text_are_ascii_decimals_only(value, param):
    # Decimal() reads most of these (underscores, other scripts' digits, a lone '+' or '.').
    with pytest.raises(InvalidValue) as caught:
        bid_parsed(value, param=param)
    assert caught.value.param == param
    # The message says what is read, and what it gives as examples is read.
    message = str(caught.value)
    assert "0.01, 2 or 1e-2" in message and "spaces around it are ignored" in message
    for example in ("0.01", "2", "1e-2", " 0.01 "):
        assert bid_parsed(example, param=param) == Decimal(example.strip())


def test_the_bid_header_and_field_refuse_non_ascii_digits():
    body = {"model": "m", "prompt": "x"}
    with pytest.raises(InvalidValue) as caught:
        completion_params(body, endpoint=COMPLETIONS, headers={"x-bid": "1_0"})
    assert caught.value.param == "X-Bid"
    with pytest.raises(InvalidValue) as caught:
        completion_params(body | {"bid": "٣"}, endpoint=COMPLETIONS, headers={})
    assert caught.value.param == "bid"


@pytest.mark.parametrize("value", ["-0", "-0.0", "-0E-9", "-0e5", Decimal("-0"), Decimal("-0.00")])
def test_negative_zero_is_a_zero_bid(value):
    bid = bid_parsed(value, param="bid")
    assert bid == 0 and not bid.is_signed()
    assert money_str(bid) == "0.000000000"


def test_a_json_negative_zero_bid_is_zero():
    body = body_parsed(b'{"model": "m", "prompt": "x", "bid": -0.0}')
    params = completion_params(body, endpoint=COMPLETIONS, headers={"x-bid": "-0"})
    assert params.bid == 0 and not params.bid.is_signed()
