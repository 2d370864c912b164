"""Every policy of the market runs on SGLang with the plugin: the bid policies inside the plugin
(``config.MARKET_POLICIES``), the others as SGLang's own policies of the same name."""

from __future__ import annotations

from sglang.srt.managers.schedule_policy import CacheAgnosticPolicy, CacheAwarePolicy

from engines.sglang_plugin.config import MARKET_POLICIES, PluginConfig
from mechanism import POLICIES

SGLANG_POLICIES = {p.value for p in CacheAwarePolicy} | {p.value for p in CacheAgnosticPolicy}


def test_every_market_policy_runs_in_the_plugin_or_in_sglang() -> None:
    for policy in POLICIES:
        config = PluginConfig(policy=policy)
        if policy in MARKET_POLICIES:
            assert config.market_policy and policy not in SGLANG_POLICIES
        else:
            assert not config.market_policy and policy in SGLANG_POLICIES
