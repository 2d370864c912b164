"""The market's control for schedulers that order one queue together (attention TP > 1).

With attention tensor parallelism, each rank of the attention-TP group runs its own scheduler
over the same queue, and they must order it identically (ranks that disagree hang the batch).
A follower per rank would read the control store at different moments and switch in different
rounds. So only the group's first rank follows the store, and every ``every`` rounds it hands
what it has taken (most often nothing) to all ranks of the group with SGLang's own
``broadcast_pyobj`` on the group's CPU (gloo) group, the way SGLang's scheduler shares its
received requests: all ranks then apply the same state from the same round.

The ranks call ``take`` once per round in lockstep (SGLang's scheduler makes the same decisions
on every rank of the group), so they reach the broadcasts together. A change takes effect at
most ``every`` rounds later; the broadcast costs one small collective per ``every`` rounds.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.utils.common import broadcast_pyobj

from engines.contract.control import ControlFollower, ControlState

DEFAULT_EVERY = 16  # rounds between two broadcasts


class RankSharedControl:
    """``take()`` as a follower's, shared by the ranks of one attention-TP group.

    ``follower``: the store's follower on the group's first rank (``src``), None elsewhere;
    ``group``: the group's CPU process group; ``rank``: this process's global rank.
    """

    def __init__(
        self,
        follower: ControlFollower | None,
        *,
        group: Any,
        src: int,
        rank: int,
        every: int = DEFAULT_EVERY,
    ) -> None:
        if every < 1:
            raise ValueError("every must be >= 1")
        if (rank == src) != (follower is not None):
            raise ValueError("the follower runs on the group's first rank, and only there")
        self.follower = follower
        self.group = group
        self.src = src
        self.rank = rank
        self.every = every
        self.rounds = 0
        self.broadcasts = 0

    def take(self) -> ControlState | None:
        """The state to apply from this round (the same on every rank), or None."""
        self.rounds += 1
        if self.rounds % self.every:
            return None
        self.broadcasts += 1
        if self.follower is not None:
            state = self.follower.take()
            data = [] if state is None else [state]
        else:
            data = []
        shared = broadcast_pyobj(data, self.rank, self.group, src=self.src)
        return shared[0] if shared else None

    def stop(self) -> None:
        if self.follower is not None:
            self.follower.stop()
