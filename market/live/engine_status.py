"""Engine status from its Prometheus ``/metrics`` (SGLang's ``sglang:`` names).

Both engines export them: SGLang itself and the simulated engine (``engines.sim``). A market of
several replicas is scraped replica by replica (each its own history), and its status is the
fleet's: queue and running summed, tokens per second summed, the cache hit rate as all cached
over all prompt tokens, TTFT quantiles from the replicas' histograms merged; each replica's own
status rides along in ``replicas``.
Gauges are read as they are (queue length, running requests, cache hit rate); rates and TTFT
quantiles need two scrapes: each scrape is kept in the cache for ``HISTORY_S`` seconds, and the
status compares the newest with the oldest kept within ``WINDOW_S`` (so any process polling,
any Celery worker, sees the same window).
"""

from __future__ import annotations

import logging
import math
import time
from typing import TypedDict, cast

from django.core.cache import cache
from prometheus_client.parser import text_string_to_metric_families

from engines.client import EngineError, engine_client
from market.payloads import EngineStatus, ReplicaStatus

logger = logging.getLogger(__name__)

TIMEOUT_S = 0.5  # connect and read timeout of one scrape, seconds
WINDOW_S = 30.0  # rates and quantiles cover about this many seconds
HISTORY_S = 40.0  # scrapes kept
CHART_POINTS = 600  # statuses kept for the console's engine chart (10 minutes at 1 a second)
TTFT = "sglang:time_to_first_token_seconds"


class EngineSample(TypedDict):
    """What one scrape says. Counters are totals since the engine started."""

    at: float  # Unix seconds
    queue: float | None
    running: float | None
    cache_hit_rate: float | None
    cached_tokens: float | None
    generation_tokens: float | None
    prompt_tokens: float | None
    ttft_buckets: list[tuple[float, float]]  # (upper bound s, cumulative count), ascending


def metrics_parse(text: str, *, at: float) -> EngineSample:
    """The sample in a Prometheus text exposition (unknown metrics are ignored).

    ValueError when the text is not an exposition.
    """
    values: dict[str, float] = {}
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{TTFT}_bucket":
                le = float(s.labels.get("le", "inf"))
                buckets[le] = buckets.get(le, 0.0) + s.value
            else:
                values[s.name] = values.get(s.name, 0.0) + s.value
    return {
        "at": at,
        "queue": values.get("sglang:num_queue_reqs"),
        "running": values.get("sglang:num_running_reqs"),
        "cache_hit_rate": values.get("sglang:cache_hit_rate"),
        "cached_tokens": values.get("sglang:cached_tokens_total"),
        "generation_tokens": values.get("sglang:generation_tokens_total"),
        "prompt_tokens": values.get("sglang:prompt_tokens_total"),
        "ttft_buckets": sorted(buckets.items()),
    }


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile (0..1) of a cumulative histogram, Prometheus-style: linear within the
    bucket that holds it; the largest finite bound when it falls in the +Inf bucket. None when
    the histogram is empty."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def _bucket_delta(
    new: list[tuple[float, float]], old: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    before = dict(old)
    return [(le, count - before.get(le, 0.0)) for le, count in new]


def _rate(new: float | None, old: float | None, dt: float) -> float | None:
    if new is None or old is None or dt <= 0 or new < old:  # new < old: the engine restarted
        return None
    return (new - old) / dt


def _window(
    sample: EngineSample, history: list[EngineSample]
) -> tuple[EngineSample | None, float, list[tuple[float, float]], float | None]:
    """The base sample of the rates (the oldest within the window, of the same engine run),
    the seconds since it, the TTFT histogram of the window, and the window's length (None: the
    histogram is the whole run's, since nothing finished in the window)."""
    base = None
    for old in history:
        same_run = (old["generation_tokens"] or 0) <= (sample["generation_tokens"] or 0) and (
            old["prompt_tokens"] or 0
        ) <= (sample["prompt_tokens"] or 0)  # counters that went down: the engine restarted
        if 0 < sample["at"] - old["at"] <= WINDOW_S + 1 and same_run:
            base = old
            break
    dt = sample["at"] - base["at"] if base else 0.0
    buckets = _bucket_delta(sample["ttft_buckets"], base["ttft_buckets"]) if base else []
    if not buckets or buckets[-1][1] <= 0:
        return base, dt, sample["ttft_buckets"], None
    return base, dt, buckets, dt


def engine_status(
    *, market: str, sample: EngineSample, history: list[EngineSample]
) -> EngineStatus:
    """The status of ``market``'s engine from its newest ``sample`` and earlier ones."""
    return _status(market, sample, _window(sample, history))


def _status(
    market: str,
    sample: EngineSample,
    window_of: tuple[EngineSample | None, float, list[tuple[float, float]], float | None],
) -> EngineStatus:
    """The status from a sample and its ``_window``."""
    base, dt, buckets, window = window_of

    def as_int(value: float | None) -> int | None:
        return None if value is None else int(value)

    def rate(name: str) -> float | None:
        return _rate(sample[name], base[name] if base else None, dt)  # type: ignore[literal-required]

    return {
        **engine_down(market=market, error="", at=sample["at"]),
        "up": True,
        "queue": as_int(sample["queue"]),
        "running": as_int(sample["running"]),
        "cache_hit_rate": sample["cache_hit_rate"],
        "tokens_per_second": rate("generation_tokens"),
        "prompt_tokens_per_second": rate("prompt_tokens"),
        "ttft_p50_s": histogram_quantile(0.5, buckets),
        "ttft_p99_s": histogram_quantile(0.99, buckets),
        "window_s": window,
    }


def fleet_status(
    *, market: str, at: float, parts: list[tuple[ReplicaStatus, EngineSample | None, list]]
) -> EngineStatus:
    """A market's status over its replicas: ``parts`` is, per replica, its own status, its
    newest sample (None: down) and the TTFT histogram its quantiles came from."""
    up = [(status, sample, buckets) for status, sample, buckets in parts if sample is not None]
    down = [status for status, sample, _ in parts if sample is None]
    if not up:
        status = engine_down(
            market=market, at=at, error="; ".join(f"{r['engine_id']}: {r['error']}" for r in down)
        )
        status["replicas"] = [r for r, _, _ in parts]
        return status

    def total(values: list[float | int | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    prompt = total([sample["prompt_tokens"] for _, sample, _ in up])
    cached = total([
        sample["cached_tokens"] if sample["cached_tokens"] is not None
        else (sample["cache_hit_rate"] or 0.0) * (sample["prompt_tokens"] or 0.0)
        for _, sample, _ in up
    ])  # fmt: skip
    merged: dict[float, float] = {}
    for _, _, buckets in up:
        for le, count in buckets:
            merged[le] = merged.get(le, 0.0) + count
    buckets = sorted(merged.items())
    windows = [r["window_s"] for r, _, _ in up if r["window_s"] is not None]
    queue, running = total([r["queue"] for r, _, _ in up]), total([r["running"] for r, _, _ in up])
    return {
        **engine_down(market=market, error="", at=at),
        "up": True,
        "error": "; ".join(f"{r['engine_id']} down: {r['error']}" for r in down),
        "queue": None if queue is None else int(queue),
        "running": None if running is None else int(running),
        "cache_hit_rate": cached / prompt if prompt and cached is not None else None,
        "tokens_per_second": total([r["tokens_per_second"] for r, _, _ in up]),
        "prompt_tokens_per_second": total([r["prompt_tokens_per_second"] for r, _, _ in up]),
        "ttft_p50_s": histogram_quantile(0.5, buckets),
        "ttft_p99_s": histogram_quantile(0.99, buckets),
        "window_s": max(windows) if windows else None,
        "replicas": [r for r, _, _ in parts],
    }


def engine_down(*, market: str, error: str, at: float) -> EngineStatus:
    """The status of an engine that did not answer (what an answer's status fills in)."""
    return {
        "kind": "engine.status",
        "market": market,
        "at": at,
        "up": False,
        "error": error,
        "queue": None,
        "running": None,
        "cache_hit_rate": None,
        "tokens_per_second": None,
        "prompt_tokens_per_second": None,
        "ttft_p50_s": None,
        "ttft_p99_s": None,
        "window_s": None,
    }


def _history_key(market: str, engine_id: str = "") -> str:
    return (
        f"live:engine:{market}:{engine_id}:history"
        if engine_id
        else f"live:engine:{market}:history"
    )


def last_key(market: str) -> str:
    return f"live:engine:{market}:last"


def engine_status_last(market: str) -> EngineStatus | None:
    """The latest status polled for ``market`` (any process), or None."""
    return cache.get(last_key(market))


def _chart_key(market: str) -> str:
    return f"live:engine:{market}:chart"


def engine_chart(market: str) -> list[list[float | None]]:
    """``[at, queue, output tokens/s]`` of the statuses polled in the last ten minutes or so,
    oldest first (what a console that was just opened draws before its socket speaks)."""
    return cache.get(_chart_key(market)) or []


def engine_status_poll(
    *,
    market: str,
    engine_url: str,
    replicas: list[tuple[str, str]] | None = None,
    now: float | None = None,
) -> EngineStatus:
    """Scrape the market's engines once (the one engine client): each of ``replicas``
    ((engine id, base URL) of every enabled replica) or, with none, the one at ``engine_url``;
    remember the samples and the status."""
    now = time.time() if now is None else now
    if replicas:
        parts = [_scrape(market, engine_id, url, now) for engine_id, url in replicas]
        status = fleet_status(
            market=market, at=now, parts=[(r, sample, b) for r, _, sample, b in parts]
        )
    else:
        status = _scrape(market, "", engine_url, now)[1]
    if status["up"]:
        point = [now, status["queue"], status["tokens_per_second"]]
        chart = [p for p in engine_chart(market) if now - p[0] <= CHART_POINTS][-CHART_POINTS:]
        cache.set(_chart_key(market), [*chart, point], timeout=CHART_POINTS)
    cache.set(last_key(market), status, timeout=int(HISTORY_S))
    return status


def _scrape(
    market: str, engine_id: str, url: str, now: float
) -> tuple[ReplicaStatus, EngineStatus, EngineSample | None, list[tuple[float, float]]]:
    """One engine's scrape: its summary as a replica, its status, its sample (None: down) and
    its TTFT histogram of the window; its sample joins its history."""
    client = engine_client()
    sample: EngineSample | None = None
    buckets: list[tuple[float, float]] = []
    try:
        text = client.call_sync(lambda: client.metrics(base_url=url, timeout_s=TIMEOUT_S))
        sample = metrics_parse(text, at=now)
    except (EngineError, ValueError) as exc:
        status = engine_down(market=market, error=f"{type(exc).__name__}: {exc}"[:300], at=now)
    else:
        key = _history_key(market, engine_id)
        history = [s for s in cache.get(key) or [] if now - s["at"] <= HISTORY_S]
        window = _window(sample, history)
        status = _status(market, sample, window)
        buckets = window[2]
        cache.set(key, [*history, sample], timeout=int(HISTORY_S) + 10)
    # Its status's fields that a replica's part has (no kind, market, time or p99).
    own = {k: v for k, v in status.items() if k in ReplicaStatus.__annotations__}
    replica = cast(ReplicaStatus, {"engine_id": engine_id, "url": url, **own})
    return replica, status, sample, buckets
