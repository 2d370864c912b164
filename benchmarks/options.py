"""The benchmarks' one rule for a command-line list: comma-separated positive numbers
(``--loads 0.8,1.2``), refused with the option's name on anything else; one positive number is
a list of one (``--wait-multiple 8``)."""

from __future__ import annotations

import argparse
import math


def _positives(text: str, kind: type, noun: str) -> tuple:
    try:
        values = tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {noun} separated by commas: {text!r}") from None
    if not values or not all(0 < v < math.inf for v in values):  # NaN fails too
        raise argparse.ArgumentTypeError(f"expected positive {noun}: {text!r}")
    return values


def floats(text: str) -> tuple[float, ...]:
    """Comma-separated positive finite numbers, for argparse's ``type``."""
    return _positives(text, float, "numbers")


def ints(text: str) -> tuple[int, ...]:
    """Comma-separated positive whole numbers, for argparse's ``type``."""
    return _positives(text, int, "integers")


def positive(text: str) -> float:
    """One positive finite number, for argparse's ``type``."""
    if "," in text:
        raise argparse.ArgumentTypeError(f"expected one positive number: {text!r}")
    return float(_positives(text, float, "number")[0])
