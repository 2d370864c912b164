"""The plugin's counters on SGLang's ``/metrics``, next to SGLang's own ``sglang:`` series.

SGLang exports the scheduler processes' metrics through prometheus_client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``, set by ``--enable-metrics``), so a counter made here in the
scheduler process is served by the HTTP server's ``/metrics``. Without prometheus_client (or
metrics off) the counters are still kept on the plugin's objects; these only publish them.

- ``market_plugin_order_failures_total``: rounds the market could not order (the queue then
  runs in SGLang's order and the request tree is rebuilt);
- ``market_plugin_unreadable_requests_total``: requests the market could not place in its tree,
  served in queue order outside the auction;
- ``market_plugin_control_changes_total``: the market's policy and reserve changes applied;
- ``market_plugin_control_refused_total``: control states refused (the values in effect stay).
"""

from __future__ import annotations

from typing import Any

NAMES = {
    "order_failures": "rounds the market could not order",
    "unreadable_requests": "requests served outside the auction (the market could not read them)",
    "control_changes": "changes of the market's policy or reserve applied",
    "control_refused": "control states refused",
}

_counters: dict[str, Any] = {}


def count(name: str, amount: int = 1) -> None:
    """Add ``amount`` to the counter ``market_plugin_<name>_total``, if Prometheus is there."""
    counter = _counters.get(name)
    if counter is None:
        counter = _counters[name] = _make(name)
    if counter is not False:
        counter.inc(amount)


def _make(name: str) -> Any:
    """The counter, made once per process (``_counters`` keeps it); False without Prometheus."""
    try:
        from prometheus_client import Counter  # noqa: PLC0415 - optional
    except ImportError:
        return False
    return Counter(f"market_plugin_{name}", NAMES[name])
