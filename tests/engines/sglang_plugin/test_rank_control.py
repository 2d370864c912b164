"""The control store under attention TP > 1: two real processes in a gloo group (the CPU
process group SGLang's scheduler uses for the same purpose), SGLang's own ``broadcast_pyobj``,
and the plugin's ``RankSharedControl``: only the first rank follows the store, and both ranks
get each state at the same round. What cannot run here is the GPU side of TP, not this."""

from __future__ import annotations

import multiprocessing
import os
import socket
import uuid

import pytest

from engines.contract.control import RedisControlStore, now_state

ROUNDS = 64
EVERY = 8


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _market() -> str:
    return f"ranks-{uuid.uuid4().hex[:8]}"


def _rank_main(
    rank: int, port: int, redis_url: str, market: str, out: multiprocessing.Queue
) -> None:
    import torch.distributed as dist

    from engines.contract.control import ControlFollower
    from engines.sglang_plugin.market_queue import MarketQueue
    from engines.sglang_plugin.rank_control import RankSharedControl

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        group = dist.new_group([0, 1], backend="gloo")
        follower = None
        if rank == 0:
            follower = ControlFollower(
                RedisControlStore(redis_url, market), poll_s=3600, accept=MarketQueue.refusal
            )
            follower.poll()  # what start() does first; polled again by hand below
        shared = RankSharedControl(follower, group=group, src=0, rank=rank, every=EVERY)
        seen = []
        for round_ in range(1, ROUNDS + 1):
            if rank == 0 and round_ == 20:
                # The console changes the market now; the leader's follower reads it.
                RedisControlStore(redis_url, market).write(now_state("highest-bid", 0.5))
                follower.poll()
            state = shared.take()
            if state is not None:
                seen.append((round_, state.policy, state.reserve))
        out.put((rank, seen, shared.broadcasts))
    finally:
        dist.destroy_process_group()


def test_both_ranks_switch_in_the_same_round(settings) -> None:
    market = _market()
    store = RedisControlStore(settings.REDIS_URL, market)
    store.write(now_state("dfs-auction", 0.25))  # in the store when the ranks start
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    env_before = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        procs = [
            ctx.Process(target=_rank_main, args=(r, port, settings.REDIS_URL, market, out))
            for r in (0, 1)
        ]
        for p in procs:
            p.start()
        results = dict((rank, (seen, n)) for rank, seen, n in (out.get(timeout=120) for _ in procs))
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
    finally:
        if env_before is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = env_before
    # Broadcasts at rounds 8, 16, ...: 8 of them in 64 rounds, on both ranks.
    assert results[0][1] == results[1][1] == ROUNDS // EVERY
    # The state read at start reaches both ranks at the first broadcast, round 8; the change
    # the leader read at round 20, at the next one, round 24: the same rounds on both ranks.
    expected = [(8, "dfs-auction", 0.25), (24, "highest-bid", 0.5)]
    assert results[0][0] == results[1][0] == expected


def test_the_follower_runs_on_the_first_rank_only() -> None:
    from engines.sglang_plugin.rank_control import RankSharedControl

    with pytest.raises(ValueError, match="first rank"):
        RankSharedControl(None, group=None, src=0, rank=0)
    with pytest.raises(ValueError, match="every"):
        RankSharedControl(None, group=None, src=0, rank=1, every=0)


def test_the_plugin_shares_one_follower_over_an_attention_tp_group(settings, monkeypatch) -> None:
    """The policy's wiring: which rank follows the store. SGLang's runtime context (published by
    a GPU server) stands in as the group coordinator's four fields."""
    from types import SimpleNamespace

    from engines.sglang_plugin import policy as policy_module
    from engines.sglang_plugin.config import PluginConfig
    from engines.sglang_plugin.policy import AuctionSchedulePolicy
    from engines.sglang_plugin.rank_control import RankSharedControl

    market = _market()
    RedisControlStore(settings.REDIS_URL, market).write(now_state("dfs-auction", 0.1))
    config = PluginConfig.of(policy="dfs-auction", redis_url=settings.REDIS_URL, market=market)
    for rank, leads in ((0, True), (1, False)):
        group = SimpleNamespace(world_size=2, rank=rank, first_rank=0, cpu_group=None)
        monkeypatch.setattr(policy_module, "_attn_tp_group", lambda group=group: group)
        control = AuctionSchedulePolicy._control_follower(config)
        assert isinstance(control, RankSharedControl)
        assert (control.follower is not None) is leads and control.src == 0
        control.stop()
    alone = SimpleNamespace(world_size=1, rank=0, first_rank=0, cpu_group=None)
    monkeypatch.setattr(policy_module, "_attn_tp_group", lambda: alone)
    control = AuctionSchedulePolicy._control_follower(config)
    assert not isinstance(control, RankSharedControl) and control is not None
    control.stop()
