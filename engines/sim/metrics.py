"""``GET /metrics``: Prometheus text from a private registry (one per server: tests run many).

Names follow SGLang's (``sglang:`` prefix, label ``model_name``), so a dashboard for SGLang reads
the simulated engine too; the auction's own metrics use the same prefix, for the SGLang plugin to
export under the same names later. Times are engine seconds (see realtime.EngineClock).

| metric | kind | meaning |
|---|---|---|
| sglang:cache_hit_rate | gauge | cached / admitted prompt tokens since start |
| sglang:num_queue_reqs | gauge | requests waiting |
| sglang:num_running_reqs | gauge | requests admitted and not finished |
| sglang:prompt_tokens_total | counter | prompt tokens of admitted requests |
| sglang:cached_tokens_total | counter | of those, found in the KV cache |
| sglang:generation_tokens_total | counter | output tokens generated |
| sglang:num_requests_total | counter | requests finished |
| sglang:time_to_first_token_seconds | histogram | arrival to first token |
| sglang:e2e_request_latency_seconds | histogram | arrival to last token |
| sglang:queue_time_seconds | histogram | arrival to admission |
| sglang:auction_rounds_total | counter | rounds cleared, some admitting none |
| sglang:round_records_total | counter | round records handed to the sink |
| sglang:round_records_dropped_total | counter | records dropped: Redis down, queue full |
| sglang:priority_revenue_dollars_total | counter | priority charges of admitted requests, dollars |
| sglang:requests_cancelled_total | counter | waiting requests whose client went away |
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .engine import SimRequest
from .realtime import EngineLoop

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds; SGLang's TTFT buckets with finer ones below 0.1 s for a lightly loaded engine.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0,
    2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0,
)  # fmt: skip


class _EngineCollector(Collector):
    """Reads the engine's and the loop's tallies at scrape time."""

    def __init__(self, loop: EngineLoop, model_name: str) -> None:
        self.loop = loop
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        loop, engine, labels = self.loop, self.loop.engine, [self.model_name]

        gauges = (
            ("cache_hit_rate", "Cached share of admitted prompt tokens.", engine.cache_hit_rate),
            ("num_queue_reqs", "Requests waiting.", len(engine.waiting)),
            ("num_running_reqs", "Requests running.", len(engine.running)),
        )
        counters = (
            ("prompt_tokens", "Prompt tokens admitted.", engine.prompt_tokens),
            ("cached_tokens", "Prompt tokens found in the KV cache.", engine.cached_prompt_tokens),
            ("generation_tokens", "Output tokens generated.", engine.generated_tokens),
            ("num_requests", "Requests finished.", engine.finished_requests),
            ("auction_rounds", "Auction rounds cleared.", engine.rounds),
            ("round_records", "Round records handed to the sink.", loop.records),
            ("round_records_dropped", "Round records the sink dropped.", loop.sink.dropped),
            ("priority_revenue_dollars", "Priority charges, dollars.", loop.revenue),
            ("requests_cancelled", "Waiting requests whose client left.", loop.cancelled),
        )
        for family, rows in ((GaugeMetricFamily, gauges), (CounterMetricFamily, counters)):
            for name, doc, value in rows:
                metric = family(f"sglang:{name}", doc, labels=["model_name"])
                metric.add_metric(labels, value)
                yield metric


class ServerMetrics:
    """The server's registry: engine tallies read at scrape time, latency histograms observed."""

    def __init__(self, loop: EngineLoop, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(loop, model_name))

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(
                name, doc, ["model_name"], registry=self.registry, buckets=LATENCY_BUCKETS
            ).labels(model_name)

        self.ttft = histogram("sglang:time_to_first_token_seconds", "Time to first token, s.")
        self.e2e = histogram("sglang:e2e_request_latency_seconds", "End-to-end latency, s.")
        self.queue = histogram("sglang:queue_time_seconds", "Arrival to admission, s.")
        loop.finished_listeners.append(self.observe)

    def observe(self, req: SimRequest) -> None:
        """Record a finished request's latencies (engine seconds)."""
        if req.ttft is not None:
            self.ttft.observe(req.ttft)
        if req.e2e is not None:
            self.e2e.observe(req.e2e)
        if req.admitted_at is not None:
            self.queue.observe(req.admitted_at - req.arrival)

    def exposition(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
