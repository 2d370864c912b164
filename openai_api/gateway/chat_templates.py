"""Chat messages and prompts into what the engine gets, and how many tokens that is.

A market names its template (``Market.chat_template``):

- ``"simple"``: for the simulated engine. Messages become ``<|role|>\\ncontent\\n`` blocks and a
  closing ``<|assistant|>\\n``; the text goes to the engine as ``text``, and its tokens are
  counted with the simulated engine's own tokenizer, so the count is the engine's.
- anything else: a Hugging Face model id. Its tokenizer's chat template renders the messages
  (``apply_chat_template``) and the token ids go to the engine as ``input_ids``, exactly what
  SGLang would have computed. ``transformers`` is imported only then, and is not a dependency of
  this project: a deployment that serves a real model installs it next to SGLang.

The prompt's token count sizes the request's budget hold (the worst case); the charge itself
uses the count the engine reports.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engines.contract.tokenizer import default_tokenizer
from market.models import SIMPLE_CHAT_TEMPLATE
from openai_api.gateway.errors import EngineDown
from openai_api.gateway.validation import Message


@dataclass(frozen=True)
class Prompt:
    """What to send the engine (exactly one of ``text`` and ``input_ids``) and its length."""

    text: str | None
    input_ids: list[int] | None
    tokens: int


class ChatTemplate(Protocol):
    """Turns chat messages, a text prompt or token ids into a :class:`Prompt`."""

    def chat(self, messages: Sequence[Message]) -> Prompt: ...

    def text(self, text: str) -> Prompt: ...

    def ids(self, input_ids: Sequence[int]) -> Prompt: ...


class SimpleTemplate:
    """The simulated engine's template: role-tagged text, counted by its tokenizer."""

    def __init__(self) -> None:
        self._tokenizer = default_tokenizer()

    def chat(self, messages: Sequence[Message]) -> Prompt:
        blocks = [f"<|{m.role}|>\n{m.content}\n" for m in messages]
        return self.text("".join(blocks) + "<|assistant|>\n")

    def text(self, text: str) -> Prompt:
        return Prompt(text=text, input_ids=None, tokens=len(self._tokenizer.encode(text)))

    def ids(self, input_ids: Sequence[int]) -> Prompt:
        return Prompt(text=None, input_ids=list(input_ids), tokens=len(input_ids))


class HuggingFaceTemplate:
    """A Hugging Face tokenizer's chat template; token ids go to the engine."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._lock = threading.Lock()  # fast tokenizers are not safe to share across threads

    def chat(self, messages: Sequence[Message]) -> Prompt:
        conversation = [{"role": m.role, "content": m.content} for m in messages]
        with self._lock:
            ids = self._tokenizer.apply_chat_template(
                conversation, tokenize=True, add_generation_prompt=True
            )
        if isinstance(ids, dict):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return self.ids(list(ids))

    def text(self, text: str) -> Prompt:
        with self._lock:
            ids = self._tokenizer.encode(text)
        return self.ids(list(ids))

    def ids(self, input_ids: Sequence[int]) -> Prompt:
        return Prompt(text=None, input_ids=list(input_ids), tokens=len(input_ids))


class TemplateUnavailable(EngineDown):
    """503: the market's chat template cannot be loaded (a deployment problem, not bad input)."""

    code = "chat_template_unavailable"


_SIMPLE = SimpleTemplate()
_loaded: set[str] = set()  # the Hugging Face templates loaded once in this process


def chat_template(name: str) -> ChatTemplate:
    """The template a market names; TemplateUnavailable when it cannot be loaded."""
    if name == SIMPLE_CHAT_TEMPLATE:
        return _SIMPLE
    template = _hugging_face(name)
    _loaded.add(name)
    return template


def chat_template_loaded(name: str) -> bool:
    """Whether the template ``name`` needs no loading (files, maybe the network) to use: the
    simple one, or one this process has loaded (the event loop must not wait for a load)."""
    return name == SIMPLE_CHAT_TEMPLATE or name in _loaded


@functools.lru_cache(maxsize=16)
def _hugging_face(model_id: str) -> HuggingFaceTemplate:
    try:
        from transformers import AutoTokenizer  # noqa: PLC0415 (heavy and optional)
    except ImportError:
        raise TemplateUnavailable(
            f"the market's chat template {model_id!r} needs the transformers package, which "
            "is not installed"
        ) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id)
    except Exception as exc:  # noqa: BLE001 (any loading failure is the same 503)
        raise TemplateUnavailable(
            f"the tokenizer of {model_id!r} could not be loaded: {exc}"
        ) from None
    return HuggingFaceTemplate(tokenizer)
