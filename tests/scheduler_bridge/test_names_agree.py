"""Names the engines, the market and settlement must agree on, each defined once.

One list of policy names (``mechanism.POLICIES``) and one check of a name
(``mechanism.policies.policy_checked``): the market's model, the simulated engine (its class,
its command line and its control path) and the SGLang plugin's config accept exactly the same
names; the market's service switches only to those offered (``mechanism.OFFERED``). (That SGLang
itself runs the names the plugin leaves to it is checked in
``tests/engines/sglang_plugin/test_policy_names.py``.) One default rounds stream
(``engines.contract.records.DEFAULT_STREAM``) that both engines write and settlement
reads."""

from __future__ import annotations

import asyncio
import inspect
import json

import pytest

from engines.contract.knobs import MarketKnobs
from engines.contract.records import DEFAULT_STREAM
from engines.contract.sinks import RedisStreamSink
from engines.sglang_plugin.config import MARKET_POLICIES, PluginConfig
from engines.sim.engine import Engine
from engines.sim.protocol import BadRequest
from engines.sim.server import ServerOptions, SimServer, parse_args
from market.models import Market, policy_known
from market.services import market_policy_set
from mechanism import BID_POLICIES, DEFAULT_POLICY, OFFERED, POLICIES
from scheduler_bridge.settlement.stream import StreamConsumer
from tests.accounts.factories import market_create

UNKNOWN = ("cheapest-first", "FCFS", "", "dfs_auction")


def test_the_market_model_checks_its_policy_against_the_mechanisms_registry() -> None:
    field = Market._meta.get_field("policy")
    assert policy_known in field.validators and field.choices is None
    assert field.default in POLICIES


@pytest.mark.django_db
def test_the_market_service_accepts_exactly_the_offered_policies() -> None:
    market = market_create()
    for policy in OFFERED:
        market_policy_set(market=market, policy=policy, user=None)
        market.refresh_from_db()
        assert market.policy == policy
    for policy in set(POLICIES) - set(OFFERED):
        with pytest.raises(ValueError, match="a baseline of the benchmarks, not offered"):
            market_policy_set(market=market, policy=policy, user=None)
    for policy in UNKNOWN:
        with pytest.raises(ValueError, match="unknown policy"):
            market_policy_set(market=market, policy=policy, user=None)
    market.refresh_from_db()
    assert market.policy == OFFERED[-1]


def test_the_simulated_engine_accepts_exactly_the_mechanisms_policies() -> None:
    engine = Engine()
    for policy in POLICIES:
        engine.set_policy(policy)
        assert engine.policy == policy
        assert Engine(policy=policy).policy == policy
        assert parse_args(["--policy", policy]).policy == policy
    for policy in UNKNOWN:
        with pytest.raises(ValueError, match="unknown policy"):
            engine.set_policy(policy)
        with pytest.raises(SystemExit):
            parse_args(["--policy", policy])


@pytest.mark.parametrize("policy", [*UNKNOWN, 3, None, ["fcfs"], {"fcfs": 1}])
def test_the_simulated_engines_control_path_refuses_other_names(policy: object) -> None:
    server = SimServer(ServerOptions.of(port=0, admin_token="s3cret"))

    class Posted:
        headers = {"Authorization": "Bearer s3cret"}

        async def read(self) -> bytes:
            return json.dumps({"policy": policy}).encode()

    with pytest.raises(BadRequest, match="policy must be one of"):
        asyncio.run(server.admin_market(Posted()))
    assert server.engine.policy == DEFAULT_POLICY


def test_the_plugin_runs_the_bid_policies_and_leaves_the_others_to_sglang() -> None:
    assert set(MARKET_POLICIES) == BID_POLICIES <= set(POLICIES)
    for policy in POLICIES:
        config = PluginConfig(policy=policy)
        assert config.market_policy == (policy in BID_POLICIES)


def test_one_default_rounds_stream(run_manage) -> None:
    assert DEFAULT_STREAM == "inference-market:rounds"
    assert PluginConfig().knobs.rounds_stream == DEFAULT_STREAM
    assert MarketKnobs().rounds_stream == DEFAULT_STREAM
    assert ServerOptions().knobs.rounds_stream == DEFAULT_STREAM
    assert parse_args([]).knobs.rounds_stream == DEFAULT_STREAM
    stream = inspect.signature(RedisStreamSink).parameters["stream"]
    assert stream.default == DEFAULT_STREAM
    assert StreamConsumer.__dataclass_fields__["stream"].default == DEFAULT_STREAM
    show = "from django.conf import settings; print(settings.ROUNDS_STREAM)"
    unset = run_manage("shell", "--no-imports", "-c", show, env={"ROUNDS_STREAM": ""})
    assert unset.returncode == 0, unset.stderr
    assert unset.stdout.split() == [DEFAULT_STREAM]
