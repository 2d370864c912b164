"""The simulated engine's tokenizer: a small deterministic one, part of the engine contract
(the gateway counts a ``simple``-template prompt's tokens with it, exactly as the engine does).

Text is split into pieces (runs of word characters, single punctuation marks, runs of
whitespace); a piece's id is a stable hash (``zlib.crc32``) into the engine's 32,000-token
vocabulary. The same text always gives the same ids, so prompts that share a leading text share
a leading token run, which is all the KV cache and the request tree care about.

Decoding uses a reverse map of the pieces seen so far (at most one piece per id, so it is bounded
by the vocabulary). An id never seen, such as the engine's synthetic output, decodes to a
pseudo-word from a fixed word list with a leading space, so generated text reads as words.
"""

from __future__ import annotations

import re
import threading
import zlib
from collections.abc import Iterable, Sequence

VOCAB = 32_000  # the simulated engine's vocabulary (token ids in [0, VOCAB))

NAME = "sim-words-32k"  # what /get_model_info reports as the tokenizer path
_PIECE = re.compile(r"\w+|[^\w\s]|\s+")
# Pseudo-words for ids that no text has produced (the engine's synthetic output).
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there one all we their can has been more if will would "
    "who so no market bid round prefix cache token engine queue price reserve charge tenant "
    "budget subtree auction serve wait model batch prompt order value time second dollar"
).split()
LABEL_CHARS = 40  # order-book labels are cut to this many characters


def piece_id(piece: str) -> int:
    """The token id of one piece of text."""
    return zlib.crc32(piece.encode("utf-8", "surrogatepass")) % VOCAB


class Tokenizer:
    """Text to token ids and back; thread-safe (the reverse map is shared)."""

    def __init__(self) -> None:
        self._pieces: dict[int, str] = {}
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; remembers each piece for decoding (first piece per id wins)."""
        pieces = _PIECE.findall(text)
        ids = [piece_id(p) for p in pieces]
        known = self._pieces
        with self._lock:
            for i, p in zip(ids, pieces, strict=True):
                known.setdefault(i, p)
        return ids

    def piece(self, token_id: int) -> str:
        """The text of one token id: the piece seen for it, or a pseudo-word."""
        text = self._pieces.get(token_id)
        if text is None:
            text = " " + _WORDS[token_id % len(_WORDS)]
        return text

    def decode(self, ids: Iterable[int]) -> str:
        """Text of a sequence of token ids."""
        return "".join(self.piece(i) for i in ids)

    def label(self, tokens: Sequence[int]) -> str:
        """A short readable label for a prompt prefix (order-book rows): decoded, squeezed, cut."""
        text = " ".join(self.decode(tokens).split())
        if len(text) > LABEL_CHARS:
            text = text[: LABEL_CHARS - 1].rstrip() + "…"
        return text


_default = Tokenizer()
encode = _default.encode


def default_tokenizer() -> Tokenizer:
    """The process-wide tokenizer the server uses (its reverse map is shared)."""
    return _default
