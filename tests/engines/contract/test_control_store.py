"""The control store's contract: the state's text, a follower that gives each new state once,
refuses what an engine cannot run, and survives a store that is down."""

from __future__ import annotations

import pytest

from engines.contract.control import (
    SCHEMA,
    ControlFollower,
    ControlState,
    RedisControlStore,
    control_dumps,
    control_loads,
    control_texts,
    follower_for,
    now_state,
)
from engines.contract.wire import ControlError
from tests.conftest import dead_port


class Store:
    """A store whose text the test sets (or makes fail)."""

    def __init__(self) -> None:
        self.text: str | None = None
        self.down = False

    def read(self) -> str | None:
        if self.down:
            raise ConnectionError("refused")
        return self.text

    def write(self, state: ControlState) -> None:
        self.text = control_dumps(state)

    def close(self) -> None:
        pass


def test_the_state_round_trips_and_bad_ones_are_refused() -> None:
    state = ControlState("dfs-auction", 0.25, 1700000000.5, wait_bound_s=45.0)
    assert control_loads(control_dumps(state)) == state
    assert control_loads(control_dumps(state)).wait_bound_s == 45.0
    assert state != ControlState("dfs-auction", 0.25, 1700000000.5)  # the bound is a value
    # A state written before the wait bound existed: the bound is off.
    good = f'{{"schema": "{SCHEMA}", "policy": "fcfs", "reserve": 1}}'
    assert control_loads(good) == ControlState("fcfs", 1.0, 0.0, wait_bound_s=0.0)
    for text, words in [
        ("{", "not JSON"),
        ("[]", "JSON object"),
        ('{"policy": "fcfs", "reserve": 0}', "schema"),
        (f'{{"schema": "{SCHEMA}", "policy": "fcfs"}}', "needs a policy and a reserve"),
        (f'{{"schema": "{SCHEMA}", "policy": "cheap", "reserve": 0}}', "policy must be one of"),
        (f'{{"schema": "{SCHEMA}", "policy": "fcfs", "reserve": -1}}', "reserve must be"),
        (
            f'{{"schema": "{SCHEMA}", "policy": "fcfs", "reserve": 0, "wait_bound_s": 0.1}}',
            "wait bound must be 0",
        ),
    ]:
        with pytest.raises(ControlError, match=words):
            control_loads(text)


def test_a_follower_gives_each_change_once_and_keeps_the_last_good_one() -> None:
    store = Store()
    follower = ControlFollower(store, accept=lambda s: "no" if s.policy == "lpm" else None)
    follower.poll()
    assert follower.take() is None  # nothing written yet
    store.write(ControlState("fcfs", 0.5))
    follower.poll()
    follower.poll()  # the same values again: not a change
    assert follower.take() == ControlState("fcfs", 0.5) and follower.take() is None
    store.write(ControlState("lpm", 0.5))
    follower.poll()
    assert follower.take() is None and follower.refused == 1
    store.text = "{broken"
    follower.poll()
    assert follower.refused == 2
    store.down = True
    follower.poll()
    assert follower.read_errors == 1 and follower.take() is None
    store.down = False
    store.write(ControlState("dfs-auction", 0.0))
    follower.poll()
    assert follower.take() == ControlState("dfs-auction", 0.0)
    assert follower.stats() == {"reads": 6, "read_errors": 1, "refused": 2, "changes": 2}


def test_which_store_is_followed(settings) -> None:
    assert follower_for(market="m", redis_url=None) is None
    follower = follower_for(market="m", redis_url=settings.REDIS_URL)
    assert isinstance(follower.store, RedisControlStore)
    assert follower.store.key == "inference-market:control:m"
    dead = follower_for(market="m", redis_url=f"redis://127.0.0.1:{dead_port()}/0")
    dead.poll()  # a store that is down is counted, never raised
    assert dead.read_errors == 1
    with pytest.raises(ValueError, match="poll_s must be > 0"):
        ControlFollower(Store(), poll_s=0)


def test_replace_leaves_a_state_written_between_its_read_and_its_write(
    settings, unique_slug
) -> None:
    """The periodic write-back of a stale store (``replace``) never overwrites a state another
    writer (an operator's push) wrote after it read the key: it writes nothing then."""
    store = RedisControlStore(settings.REDIS_URL, unique_slug)
    other = RedisControlStore(settings.REDIS_URL, unique_slug)
    read: list[bytes | None] = []

    def make(text: bytes | None) -> ControlState:
        read.append(text)
        return now_state("fcfs", 0.5)

    assert store.replace(make) is True and read == [None]
    assert control_loads(store.read()) == ControlState("fcfs", 0.5)
    assert store.replace(lambda text: None) is False  # nothing to write: nothing written
    assert control_loads(store.read()) == ControlState("fcfs", 0.5)

    def raced(text: bytes | None) -> ControlState:
        other.write(now_state("dfs-auction-density", 0.25))  # the push, meanwhile
        return now_state("fcfs", 0.75)

    assert store.replace(raced) is False
    assert control_loads(store.read()) == ControlState("dfs-auction-density", 0.25)
    texts = control_texts(settings.REDIS_URL, [unique_slug, f"{unique_slug}-none"])
    assert control_loads(texts[unique_slug]) == ControlState("dfs-auction-density", 0.25)
    assert texts[f"{unique_slug}-none"] is None and control_texts(settings.REDIS_URL, []) == {}
    store.client.delete(store.key)
    store.close()
    other.close()
