"""Client text that can be kept: the one rule for strings from outside, wherever they enter.

PostgreSQL refuses NUL (U+0000) in text columns, in query parameters and in JSON values
(``\\u0000 cannot be converted to text``), and UTF-8 cannot encode a lone surrogate (U+D800 to
U+DFFF, what a JSON escape such as ``"\\ud800"`` decodes to in Python), so either one in a
client's string fails deep inside a write or a query, as a 500. Every boundary that takes
client text (the gateway's bodies, paths and query strings, batch lines and their metadata, the
tenant JSON API and its forms) checks it here first and refuses it, naming the field.

JSON nested deeper than :data:`MAX_JSON_DEPTH` is refused here too: no body of ours needs it,
and a value nested near Python's recursion limit would fail later, when it is encoded again.
Pure: no Django.
"""

from __future__ import annotations

import re
from typing import Any

MAX_JSON_DEPTH = 32  # arrays and objects inside one another; OpenAI's bodies need 4
_UNKEPT = re.compile("[\x00\ud800-\udfff]")


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be kept as text (a NUL, a lone surrogate), or None when it can."""
    found = _UNKEPT.search(value)
    if found is None:
        return None
    char = found.group()
    if char == "\x00":
        return f"contains a NUL character (U+0000) at position {found.start()}"
    return f"contains a lone surrogate (U+{ord(char):04X}) at position {found.start()}, not text"


def json_problem(value: Any, *, path: str = "") -> tuple[str, str] | None:
    """(where, why) for the first string of a parsed JSON ``value`` (object keys included)
    that :func:`text_problem` refuses, or for nesting deeper than :data:`MAX_JSON_DEPTH`;
    None when every string can be kept. ``where`` is the field's path from ``path``
    (``messages[0].content``), ``path`` itself for ``value``, "" for a top-level value."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:  # iterative: a deep value must not hit the recursion limit here either
        item, where, depth = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return where, problem
        elif isinstance(item, dict | list):
            if depth >= MAX_JSON_DEPTH:
                return where, f"is nested deeper than {MAX_JSON_DEPTH} arrays or objects"
            if isinstance(item, list):
                children = [(v, f"{where}[{i}]") for i, v in enumerate(item)]
            else:
                children = []
                for key, v in item.items():
                    if isinstance(key, str) and (problem := text_problem(key)) is not None:
                        return where, f"has a key that {problem}"  # the object, not the key
                    children.append((v, f"{where}.{key}" if where else str(key)))
            stack.extend((v, w, depth + 1) for v, w in reversed(children))
    return None


def whole_number(text: str, *, low: int, high: int) -> int:
    """``text`` as a whole number in ``low..high``; ValueError saying what is wrong.

    ASCII digits only: ``int()`` also reads ``"1_0"``, spaces and other scripts' digits. A number
    of more digits than ``high`` has is out of range before it is converted (Python refuses to
    convert more than 4,300 digits, a 500 if it were let through).
    """
    if not (text.isascii() and text.isdigit()):
        raise ValueError("must be an integer (ASCII digits)")
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(high)) or not low <= int(digits) <= high:
        raise ValueError(f"must be in {low}..{high}")
    return int(digits)
