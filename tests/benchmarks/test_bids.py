"""Bid distributions: their ranges and the class each bid gets."""

from __future__ import annotations

import math
import random

import pytest

from benchmarks.bids import BidSpec, classes_by_quantile


def test_uniform_and_lognormal_classes_split_at_the_80th_percentile() -> None:
    rng = random.Random(0)
    uniform = [BidSpec("uniform", low=1.0, high=3.0).draw(rng) for _ in range(2000)]
    assert all(1.0 <= b <= 3.0 for b, _ in uniform)
    assert all((c == "high") == (b > 2.6) for b, c in uniform)
    logn = [BidSpec("lognormal", mu=0.0, sigma=1.0).draw(rng) for _ in range(2000)]
    cut = math.exp(0.8416212335729143)
    assert all((c == "high") == (b > cut) for b, c in logn)
    assert 0.17 < sum(c == "high" for _, c in logn) / 2000 < 0.23


def test_bad_specs_raise() -> None:
    with pytest.raises(ValueError, match="unknown bid distribution"):
        BidSpec("pareto")
    with pytest.raises(ValueError, match="uniform"):
        BidSpec("uniform", low=2.0, high=1.0)
    with pytest.raises(ValueError, match="constant"):
        BidSpec("constant", value=-1.0)


def test_classes_by_quantile() -> None:
    assert classes_by_quantile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == ["low"] * 8 + ["high"] * 2
    assert classes_by_quantile([0.5, 0.5, 0.5]) == ["low"] * 3
