"""Bad input raises ValueError naming the request or the policy."""

import math
import subprocess
import sys

import pytest

from mechanism import RequestTree, WaitingRequest, clear


@pytest.mark.parametrize("bid", [-1.0, math.nan, math.inf, -math.inf, "3", None, True])
def test_invalid_bids_name_the_request(bid):
    with pytest.raises(ValueError, match="'req-7'"):
        WaitingRequest("req-7", [1, 2], bid, 0.0)


def test_empty_tokens_name_the_request():
    with pytest.raises(ValueError, match="'req-8'.*empty"):
        WaitingRequest("req-8", [], 1.0, 0.0)


@pytest.mark.parametrize("cached", [-1, 3, 1.5])
def test_cached_len_outside_the_prompt(cached):
    with pytest.raises(ValueError, match="'x'.*cached_len"):
        WaitingRequest("x", [1, 2], 1.0, 0.0, cached_len=cached)


@pytest.mark.parametrize("arrival", [math.nan, math.inf, "now"])
def test_bad_arrival(arrival):
    with pytest.raises(ValueError, match="'x'.*arrival"):
        WaitingRequest("x", [1], 1.0, arrival)


def test_empty_id():
    with pytest.raises(ValueError, match="id"):
        WaitingRequest("", [1], 1.0, 0.0)


def test_duplicate_ids_name_the_request():
    reqs = [WaitingRequest("dup", [1], 1.0, 0.0), WaitingRequest("dup", [2], 1.0, 1.0)]
    with pytest.raises(ValueError, match="duplicate request id 'dup'"):
        clear(reqs, "fcfs")


def test_unknown_policy_is_named():
    with pytest.raises(ValueError, match="'fastest'"):
        clear([WaitingRequest("a", [1], 1.0, 0.0)], "fastest")


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"reserve": -0.1}, "reserve"),
        ({"reserve": math.nan}, "reserve"),
        ({"tokens_per_second": 0}, "tokens_per_second"),
        ({"overhead_tokens": -1}, "overhead"),
    ],
)
def test_bad_round_parameters(kwargs, word):
    with pytest.raises(ValueError, match=word):
        clear([WaitingRequest("a", [1], 1.0, 0.0)], "fcfs", **kwargs)


def test_tree_rejects_unknown_ids_and_bad_updates():
    tree = RequestTree([WaitingRequest("a", [1, 2], 1.0, 0.0)])
    with pytest.raises(ValueError, match="'zz'"):
        tree.remove("zz")
    with pytest.raises(ValueError, match="'a'"):
        tree.update("a", bid=-3)
    with pytest.raises(ValueError, match="'a'.*cached_len"):
        tree.update("a", cached_len=9)
    assert tree.get("a").bid == 1.0  # a rejected update changes nothing


def test_a_stale_prefill_batch_is_refused_and_marks_nothing():
    tree = RequestTree(
        [WaitingRequest("a", [1, 2, 3], 1.0, 0.0), WaitingRequest("b", [1, 2, 4], 1.0, 1.0)]
    )
    old = tree.begin_batch()
    new = tree.begin_batch()
    with pytest.raises(ValueError, match=f"batch {old} is not"):
        tree.batch_add("a", old)
    with pytest.raises(ValueError, match=f"batch {old} is not"):
        tree.batch_recomputed("b", old)
    # The current batch is as it was: with "a" in it, "b" computes its 2 shared, uncached
    # tokens ([1, 2]) a second time.
    tree.batch_add("a", new)
    assert tree.batch_recomputed("b", new) == 2


def test_mechanism_imports_no_framework():
    code = (
        "import sys, mechanism, mechanism.bench\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'celery', 'sglang',"
        " 'channels', 'torch')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
