"""``GET /v1/loads``: the engine's load as SGLang 0.5.23 reports it, for SGLang's model gateway.

smg polls each worker's ``/v1/loads?include=core,disagg,queues,memory`` and routes on it: its
worker-overload protection leaves out a replica with ``num_waiting_reqs`` at or above its
threshold (8) or ``token_usage`` at or above 0.8, and its load-aware policies compare
``token_usage``. The body is SGLang's (``sglang.srt.entrypoints.v1_loads`` and
``sglang.srt.managers.load_snapshot.LoadSnapshot``): ``timestamp`` (ISO 8601, UTC),
``version``, ``accelerator`` and ``num_accelerators`` (none here), and ``loads``, one snapshot
per data-parallel rank (one here). A snapshot has the flat "core" fields and, when asked for,
the sections the simulated engine has: ``disaggregation`` (mode "null") and ``queues``; it has
no ``memory``, ``speculative`` or ``lora`` section, which SGLang leaves out too when it has none.

The figures, from the simulated engine's state when asked (token counts in tokens):

- ``num_used_tokens``: KV tokens the running requests hold (locked in the cache or reserved
  outside it), of ``max_total_num_tokens``; ``token_usage`` is their ratio, as SGLang's;
- ``num_waiting_uncached_tokens``: the waiting requests' prompt tokens not in the cache;
- ``num_total_tokens`` (= ``num_active_tokens``): used tokens plus the waiting requests';
- ``gen_throughput``: output tokens per engine second since the previous report (0 at the
  first), ``cache_hit_rate`` the cached share of admitted prompt tokens, ``utilization`` the
  running requests over ``max_running_requests``;
- ``total_prefill_uncached_tokens`` and ``total_prefill_busy_us`` (engine microseconds spent in
  prefill steps) since start, SGLang's cumulative counters.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from .engine import Engine
from .protocol import BadRequest
from .realtime import EngineClock

SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def sections_read(include: str | None) -> frozenset[str] | None:
    """The sections ``include`` asks for (None: all); BadRequest for an unknown one."""
    if include is None:
        return None
    asked = frozenset(s.strip() for s in include.split(","))
    unknown = asked - SECTIONS
    if unknown:
        raise BadRequest(
            f"unknown include section(s) {sorted(unknown)}; valid: {sorted(SECTIONS)}", "include"
        )
    return None if "all" in asked else asked


class LoadReport:
    """The engine's ``/v1/loads`` body; keeps the previous report's output count and time for
    ``gen_throughput``."""

    def __init__(self, engine: Engine, clock: EngineClock, version: str) -> None:
        self.engine = engine
        self.clock = clock
        self.version = version
        self._last: tuple[float, int] | None = None  # (engine time, output tokens so far)

    def body(self, include: str | None) -> dict[str, Any]:
        """SGLang's ``/v1/loads`` answer for the sections ``include`` names (None: all)."""
        sections = sections_read(include)
        return {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": self.version,
            "accelerator": None,
            "num_accelerators": 0,
            "loads": [self._snapshot(sections)],
        }

    def _snapshot(self, sections: frozenset[str] | None) -> dict[str, Any]:
        engine, config = self.engine, self.engine.config
        now = self.clock.now()
        generated = engine.generated_tokens
        last, self._last = self._last, (now, generated)
        throughput = (generated - last[1]) / (now - last[0]) if last and now > last[0] else 0.0
        kv = engine.kv
        used = kv.size - kv.evictable + engine.outside  # locked in the cache, or reserved
        waiting = engine.tree.entries.values()
        waiting_tokens = sum(len(e.req.tokens) for e in waiting)
        uncached = sum(len(e.req.tokens) - e.req.cached_len for e in waiting)
        capacity = config.kv_capacity_tokens
        snapshot: dict[str, Any] = {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": len(engine.running),
            "num_waiting_reqs": len(engine.waiting),
            "num_waiting_uncached_tokens": uncached,
            "num_used_tokens": used,
            "num_total_tokens": used + waiting_tokens,
            "num_active_tokens": used + waiting_tokens,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": capacity,
            "max_running_requests": config.max_running_requests,
            "token_usage": round(used / capacity, 4) if capacity else 0.0,
            "gen_throughput": round(throughput, 2),
            "cache_hit_rate": round(engine.cache_hit_rate, 4),
            "utilization": round(len(engine.running) / config.max_running_requests, 4),
            "total_prefill_uncached_tokens": engine.prefilled_tokens,
            "total_prefill_busy_us": round(engine.prefill_busy_s * 1e6),
            "decode_moments": None,
        }
        if sections is None or "disagg" in sections:
            snapshot["disaggregation"] = {
                "mode": "null",
                "prefill_bootstrap_queue_reqs": 0,
                "prefill_inflight_queue_reqs": 0,
                "decode_prealloc_queue_reqs": 0,
                "decode_transfer_queue_reqs": 0,
                "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0,
                "kv_transfer_latency_ms": 0.0,
            }
        if sections is None or "queues" in sections:
            snapshot["queues"] = {
                "waiting": len(engine.waiting),
                "grammar": 0,
                "paused": 0,
                "retracted": 0,
                "prealloc_ready": 0,
            }
        return snapshot
