"""The gateway's Prometheus metrics, in a registry of its own, served at ``GET /metrics``.

Labels: ``market`` (slug; ``-`` before a market is known), ``endpoint`` (``chat``,
``completions``, ``models``, ``budgets``, ``quotes``, ``usage_completions``, ``costs``),
``status`` (the HTTP status), ``error`` (the error body's code).

| metric | kind | meaning |
|---|---|---|
| gateway_requests_total | counter | answered requests, by market, endpoint, status |
| gateway_errors_total | counter | error answers, by market, endpoint, status, error |
| gateway_bids_dollars_per_second | histogram | bids as sent, $/s, by market and bid source |
| gateway_token_charges_dollars_total | counter | token charges written to the ledger, dollars |
| gateway_priority_charges_dollars_total | counter | priority charges the engine reported, dollars |
| gateway_requests_in_flight | gauge | requests forwarded and not yet answered, by market |
| gateway_requests_waiting | gauge | of those, with no byte of the engine's answer yet |
| gateway_engine_ttft_seconds | histogram | forward to the engine's first byte, seconds |
| gateway_request_duration_seconds | histogram | a request's time in the gateway, to its last byte |
| gateway_ledger_batch_size | histogram | holds or settlements written per statement, by kind |

Served by several worker processes (``config.serving``), each counts its own requests: set
``PROMETHEUS_MULTIPROC_DIR`` to an empty directory (the same for every worker, emptied before
the server starts; ``manage.py live_market`` does it) and ``/metrics`` answers the sum over the
workers (prometheus_client's multiprocess mode; the gauges are ``livesum``: a worker that dies
leaves its last values there until the directory is emptied at the server's next start).
"""

from __future__ import annotations

import os
from decimal import Decimal
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

CONTENT_TYPE = CONTENT_TYPE_LATEST
# prometheus_client reads the variable when it is imported: what it says then holds.
MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
REGISTRY = CollectorRegistry(auto_describe=True)
NO_MARKET = "-"

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
)  # fmt: skip
_BID_BUCKETS = (0, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1, 10, 100, 1e3, 1e6)

REQUESTS = Counter(
    "gateway_requests", "Answered requests.", ["market", "endpoint", "status"], registry=REGISTRY
)
ERRORS = Counter(
    "gateway_errors",
    "Error answers, by the error body's code.",
    ["market", "endpoint", "status", "error"],
    registry=REGISTRY,
)
BIDS = Histogram(
    "gateway_bids_dollars_per_second",
    "Bids as sent to the engine, dollars per second of waiting.",
    ["market", "bid_source"],
    buckets=_BID_BUCKETS,
    registry=REGISTRY,
)
TOKEN_CHARGES = Counter(
    "gateway_token_charges_dollars",
    "Token charges written to the ledger, dollars.",
    ["market"],
    registry=REGISTRY,
)
PRIORITY_CHARGES = Counter(
    "gateway_priority_charges_dollars",
    "Priority charges reported by the engine, dollars (the ledger settles them from rounds).",
    ["market"],
    registry=REGISTRY,
)
IN_FLIGHT = Gauge(
    "gateway_requests_in_flight",
    "Requests forwarded to the engine and not yet answered.",
    ["market"],
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
WAITING = Gauge(
    "gateway_requests_waiting",
    "Requests forwarded with no byte of the engine's answer yet (the queue, as seen here).",
    ["market"],
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
TTFT = Histogram(
    "gateway_engine_ttft_seconds",
    "Seconds from forwarding a request to the first byte of the engine's answer.",
    ["market"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
DURATION = Histogram(
    "gateway_request_duration_seconds",
    "Seconds a request spent in the gateway, to its last byte.",
    ["market", "endpoint"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)

LEDGER_BATCH = Histogram(
    "gateway_ledger_batch_size",
    "Holds or settlements written in one statement (the gateway's batches), by kind.",
    ["kind"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
    registry=REGISTRY,
)


def _children_kept(metric: Any) -> None:
    """``metric.labels(...)`` with each child kept in a dict once made: a request's several label
    lookups then cost a dict read each, not prometheus_client's lock and checks. The label
    values are a few names (markets, endpoints, statuses, error codes, bid sources)."""
    children: dict[tuple[str, ...], Any] = {}
    made = metric.labels

    def labels(*values: str) -> Any:
        child = children.get(values)
        if child is None:
            child = children[values] = made(*values)
        return child

    metric.labels = labels


for _metric in (REQUESTS, ERRORS, BIDS, TOKEN_CHARGES, PRIORITY_CHARGES, IN_FLIGHT, WAITING, TTFT,
                DURATION, LEDGER_BATCH):  # fmt: skip
    _children_kept(_metric)


def answered(*, market: str, endpoint: str, status: int, error: str | None = None) -> None:
    """Count one answer (and its error code, if it is an error)."""
    REQUESTS.labels(market, endpoint, str(status)).inc()
    if error is not None:
        ERRORS.labels(market, endpoint, str(status), error).inc()


def charged(*, market: str, tokens: Decimal | None, priority: Decimal | None) -> None:
    """Add a served request's charges, dollars (None: not charged now)."""
    if tokens is not None:
        TOKEN_CHARGES.labels(market).inc(float(tokens))
    if priority is not None:
        PRIORITY_CHARGES.labels(market).inc(float(priority))


def exposition() -> bytes:
    """Prometheus text exposition of the gateway's registry (of every worker's, in
    multiprocess mode)."""
    if MULTIPROCESS:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(REGISTRY)
