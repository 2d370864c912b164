"""The control body's one reading (``control_read``), which an engine applies whole or not at
all: a field left out keeps the value in effect, anything else is refused naming the field."""

from __future__ import annotations

import pytest

from engines.contract.wire import ControlError, control_read

NOW = {"policy": "fcfs", "reserve": 0.25, "wait_bound_s": 30.0}


@pytest.mark.parametrize(
    ("body", "want"),
    [
        ({}, ("fcfs", 0.25, 30.0)),
        ({"reserve": 0.5}, ("fcfs", 0.5, 30.0)),
        ({"reserve": 0}, ("fcfs", 0.0, 30.0)),
        ({"policy": "dfs-auction"}, ("dfs-auction", 0.25, 30.0)),
        ({"policy": "highest-bid", "reserve": 1e6}, ("highest-bid", 1e6, 30.0)),
        ({"wait_bound_s": 0}, ("fcfs", 0.25, 0.0)),
        ({"wait_bound_s": 0.5}, ("fcfs", 0.25, 0.5)),
        ({"wait_bound_s": 3600}, ("fcfs", 0.25, 3600.0)),
    ],
)
def test_a_good_body_changes_what_it_names(body, want) -> None:
    assert control_read(body, **NOW) == want


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ([], None, "must be a JSON object"),
        ({"reserve": 0.1, "bid": 1}, "bid", "unknown field 'bid'"),
        ({"policy": "cheapest"}, "policy", "policy must be one of"),
        ({"policy": ["fcfs"]}, "policy", "policy must be one of"),
        ({"reserve": -0.01}, "reserve", "reserve must be a number in 0..1e+06"),
        ({"reserve": 2e6}, "reserve", "reserve must be a number"),
        ({"reserve": "0.1"}, "reserve", "reserve must be a number"),
        ({"reserve": True}, "reserve", "reserve must be a number"),
        ({"policy": "fcfs", "reserve": None}, "reserve", "reserve must be a number"),
        ({"wait_bound_s": 0.25}, "wait_bound_s", "0 (off) or 0.5..3600 seconds"),
        ({"wait_bound_s": 3600.5}, "wait_bound_s", "0 (off) or 0.5..3600 seconds"),
        ({"wait_bound_s": -1}, "wait_bound_s", "0 (off) or 0.5..3600 seconds"),
        ({"wait_bound_s": float("nan")}, "wait_bound_s", "0 (off) or 0.5..3600 seconds"),
        ({"wait_bound_s": "30"}, "wait_bound_s", "0 (off) or 0.5..3600 seconds"),
        ({"wait_bound_s": True}, "wait_bound_s", "0 (off) or 0.5..3600 seconds"),
    ],
)
def test_a_bad_body_is_refused_naming_the_field(body, param, words) -> None:
    with pytest.raises(ControlError) as caught:
        control_read(body, **NOW)
    assert caught.value.param == param and words in str(caught.value)
