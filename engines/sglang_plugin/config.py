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
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from market.mechanism import BID_POLICIES, DEFAULT_TOKENS_PER_SECOND
from scheduler_bridge.contract.records import DEFAULT_STREAM

# The policies the plugin adds to SGLang; the others are SGLang's and run as SGLang runs them.
MARKET_POLICIES = tuple(sorted(BID_POLICIES))

ENV_POLICY = "MARKET_POLICY"
ENV_CONFIG = "MARKET_PLUGIN_CONFIG"
ENV_REDIS_URL = "REDIS_URL"


@dataclass(frozen=True)
class PluginConfig:
    """Everything the plugin reads. ``policy`` None leaves SGLang's own policy in charge."""

    policy: str | None = None
    reserve: float = 0.0  # $/s of waiting; a bid below it counts as 0
    tokens_per_second: float = DEFAULT_TOKENS_PER_SECOND  # the plan's prefill rate
    overhead_tokens: int = 1  # per-request work in the plan (its own last token)
    market: str = "default"  # market slug in the round records
    engine_id: str | None = None  # None: "sglang@<host>:<port>" from SGLang's server args
    redis_url: str | None = None  # None: no Redis; records are kept in memory only
    rounds_stream: str = DEFAULT_STREAM
    rounds_jsonl: str | None = None  # without Redis: append the records to this file
    book_interval_s: float | None = 0.5  # subtrees in a record at most this often; None: never
    # Keep a request that would recompute at least this many uncached tokens it shares with a
    # request already in the prefill batch for the next batch (the simulated engine does the
    # same); 0 turns it off. DFS auctions only.
    in_batch_defer_tokens: int = 32
    record_queue_size: int = 1000  # records waiting for Redis before new ones are dropped

    def __post_init__(self) -> None:
        if self.policy is not None and (not isinstance(self.policy, str) or not self.policy):
            raise ValueError(f"policy must be a non-empty string, got {self.policy!r}")
        _number(self.reserve, "reserve", low=0.0)
        _number(self.tokens_per_second, "tokens_per_second", low=0.0, strict=True)
        _integer(self.overhead_tokens, "overhead_tokens")
        _integer(self.in_batch_defer_tokens, "in_batch_defer_tokens")
        _integer(self.record_queue_size, "record_queue_size", low=1)
        if self.book_interval_s is not None:
            _number(self.book_interval_s, "book_interval_s", low=0.0)
        for name in ("market", "rounds_stream"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        for name in ("engine_id", "redis_url", "rounds_jsonl"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string or null, got {value!r}")

    @property
    def market_policy(self) -> bool:
        """Whether the plugin orders the queue itself (a policy of the market's)."""
        return self.policy in MARKET_POLICIES


def _number(value: Any, name: str, *, low: float, strict: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < low or (strict and value == low):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {low:g}, got {value!r}")


def _integer(value: Any, name: str, *, low: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


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
        known = {f.name for f in fields(PluginConfig)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"{ENV_CONFIG}={path}: unknown key(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
    policy = environ.get(ENV_POLICY, "").strip()
    if policy:
        values["policy"] = policy
    if not values.get("redis_url") and environ.get(ENV_REDIS_URL, "").strip():
        values["redis_url"] = environ[ENV_REDIS_URL].strip()
    try:
        return PluginConfig(**values)
    except ValueError as exc:
        where = f"{ENV_CONFIG}={path}" if path else "the market plugin's environment"
        raise ValueError(f"{where}: {exc}") from exc
