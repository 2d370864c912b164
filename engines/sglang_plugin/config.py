"""The plugin's settings: which policy orders SGLang's waiting queue, and where round records go.

Read once per scheduler process, when SGLang builds its ``SchedulePolicy``:

- ``MARKET_PLUGIN_CONFIG`` names a JSON file with any of the keys of ``PluginConfig``;
- ``MARKET_POLICY`` sets the policy (it wins over the file's);
- ``REDIS_URL`` is used for the round records when the file names no ``redis_url``.

With nothing set the plugin is inert: SGLang's own ``--schedule-policy`` runs unchanged.
A policy that is one of SGLang's own (``lpm``, ``dfs-weight``, ``fcfs``, ...) replaces
``--schedule-policy`` and runs as SGLang runs it; the market's policies (``MARKET_POLICIES``)
run inside the plugin. Units: reserve in dollars per second of waiting, rates in tokens per
second, intervals in seconds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from engines.contract.knobs import KNOB_NAMES, MarketKnobs, integer_checked, split_knobs
from mechanism import BID_POLICIES, DEFAULT_TOKENS_PER_SECOND

# The policies the plugin adds to SGLang; the others are SGLang's and run as SGLang runs them.
MARKET_POLICIES = tuple(sorted(BID_POLICIES))

ENV_POLICY = "MARKET_POLICY"
ENV_CONFIG = "MARKET_PLUGIN_CONFIG"
ENV_REDIS_URL = "REDIS_URL"


@dataclass(frozen=True)
class PluginConfig:
    """Everything the plugin reads. ``policy`` None leaves SGLang's own policy in charge.

    The market's knobs (reserve, plan rate, overhead, in-batch deferral, book interval, stream,
    market, charge scope, wait bound) are the contract's ``MarketKnobs``, the same the simulated
    engine embeds; ``of`` builds a config from the flat keys the JSON file uses.
    """

    policy: str | None = None
    knobs: MarketKnobs = field(default_factory=MarketKnobs)
    engine_id: str | None = None  # None: "sglang@<host>:<port>" from SGLang's server args
    redis_url: str | None = None  # None: no Redis; records are kept in memory only
    rounds_jsonl: str | None = None  # without Redis: append the records to this file
    record_queue_size: int = 1000  # records waiting for Redis before new ones are dropped
    # The market's control store (``engines.contract.control``): the policy, reserve and wait
    # bound the console sets, read at start and every ``control_poll_s`` seconds from the Redis
    # key of ``redis_url``. ``follow_control`` False: the config's values stay.
    follow_control: bool = True
    control_poll_s: float = 0.5

    def __post_init__(self) -> None:
        if self.policy is not None and (not isinstance(self.policy, str) or not self.policy):
            raise ValueError(f"policy must be a non-empty string, got {self.policy!r}")
        if not isinstance(self.knobs, MarketKnobs):
            raise ValueError(f"knobs must be MarketKnobs, got {self.knobs!r}")
        integer_checked(self.record_queue_size, "record_queue_size", low=1)
        if not isinstance(self.follow_control, bool):
            raise ValueError(f"follow_control must be true or false, got {self.follow_control!r}")
        poll = self.control_poll_s
        if isinstance(poll, bool) or not isinstance(poll, int | float) or not 0 < poll < 3600:
            raise ValueError(f"control_poll_s must be a number in (0, 3600), got {poll!r}")
        for name in ("engine_id", "redis_url", "rounds_jsonl"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string or null, got {value!r}")

    @classmethod
    def of(cls, **values: Any) -> PluginConfig:
        """A config from flat keys: the knobs' names and the plugin's own."""
        knobs, rest = split_knobs(values)
        return cls(knobs=knobs, **rest)

    @property
    def market_policy(self) -> bool:
        """Whether the plugin orders the queue itself (a policy of the market's)."""
        return self.policy in MARKET_POLICIES

    @property
    def tokens_per_second(self) -> float:
        """The plan's prefill rate: the knob, or the mechanism's default (SGLang has no model)."""
        return self.knobs.plan_rate(DEFAULT_TOKENS_PER_SECOND)


KNOWN_KEYS = frozenset(KNOB_NAMES | {f.name for f in fields(PluginConfig)} - {"knobs"})


def config_from_env(environ: Mapping[str, str] | None = None) -> PluginConfig:
    """The plugin's config from the environment (and the file it names); ValueError if bad."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    path = environ.get(ENV_CONFIG, "").strip()
    if path:
        try:
            values = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{ENV_CONFIG}={path}: cannot read a JSON object: {exc}") from exc
        if not isinstance(values, dict):
            raise ValueError(f"{ENV_CONFIG}={path}: expected a JSON object")
        unknown = sorted(set(values) - KNOWN_KEYS)
        if unknown:
            raise ValueError(
                f"{ENV_CONFIG}={path}: unknown key(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(KNOWN_KEYS))}"
            )
    policy = environ.get(ENV_POLICY, "").strip()
    if policy:
        values["policy"] = policy
    if not values.get("redis_url") and environ.get(ENV_REDIS_URL, "").strip():
        values["redis_url"] = environ[ENV_REDIS_URL].strip()
    try:
        return PluginConfig.of(**values)
    except (TypeError, ValueError) as exc:
        where = f"{ENV_CONFIG}={path}" if path else "the market plugin's environment"
        raise ValueError(f"{where}: {exc}") from exc
