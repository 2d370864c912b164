"""The simulated engine's tokenizer: deterministic, prefix-stable, decodable."""

from __future__ import annotations

import zlib

from engines.contract.tokenizer import LABEL_CHARS, VOCAB, Tokenizer
from engines.sim.engine import synthetic_output


def test_pieces_are_words_punctuation_and_whitespace_runs() -> None:
    tok = Tokenizer()
    # Hand-split: "Hello" "," " " "world" "!" "  " "ok"
    ids = tok.encode("Hello, world!  ok")
    expected = [
        zlib.crc32(p.encode()) % VOCAB for p in ["Hello", ",", " ", "world", "!", "  ", "ok"]
    ]
    assert ids == expected


def test_same_text_same_ids_across_tokenizers() -> None:
    text = "You are a helpful assistant. Answer briefly."
    assert Tokenizer().encode(text) == Tokenizer().encode(text)


def test_shared_leading_text_shares_leading_ids() -> None:
    tok = Tokenizer()
    a = tok.encode("System: be terse. User: what is 2+2?")
    b = tok.encode("System: be terse. User: name a colour")
    # "System" ":" " " "be" " " "terse" "." " " "User" ":" " " = 11 shared pieces
    assert a[:11] == b[:11]
    assert a[11] != b[11]


def test_decode_round_trips_text_it_has_seen() -> None:
    tok = Tokenizer()
    text = "The order book, grouped by prefix:\n\tbids!"
    assert tok.decode(tok.encode(text)) == text


def test_unseen_ids_decode_to_words() -> None:
    tok = Tokenizer()
    out = synthetic_output("req-1", 12)
    text = tok.decode(out)
    words = text.split()
    assert len(words) == 12
    assert all(w.isalpha() for w in words)
    assert text == tok.decode(out)  # deterministic


def test_label_is_the_squeezed_decoded_prefix_cut_short() -> None:
    tok = Tokenizer()
    short = tok.encode("Tools:\n  search, fetch")
    assert tok.label(short) == "Tools: search, fetch"
    long = tok.encode("word " * 40)
    label = tok.label(long)
    assert len(label) == LABEL_CHARS
    assert label.endswith("…")
    assert label.startswith("word word")
