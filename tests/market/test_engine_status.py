"""Engine status from Prometheus text: parsing, rates and TTFT quantiles over a window."""

from __future__ import annotations

import http.server
import threading

import pytest

from engines.sim.background import ServerThread
from engines.sim.server import ServerOptions
from market.live.engine_status import (
    engine_chart,
    engine_status,
    engine_status_last,
    engine_status_poll,
    histogram_quantile,
    metrics_parse,
)
from tests.conftest import dead_port


def exposition(*, queue: int, generated: int, prompt: int, buckets: dict[str, int]) -> str:
    """A /metrics text in SGLang's names, with a TTFT histogram of cumulative ``buckets``."""
    lines = [
        "# TYPE sglang:num_queue_reqs gauge",
        f'sglang:num_queue_reqs{{model_name="m"}} {queue}',
        "# TYPE sglang:num_running_reqs gauge",
        'sglang:num_running_reqs{model_name="m"} 3',
        "# TYPE sglang:cache_hit_rate gauge",
        'sglang:cache_hit_rate{model_name="m"} 0.75',
        "# TYPE sglang:generation_tokens counter",
        f'sglang:generation_tokens_total{{model_name="m"}} {generated}',
        "# TYPE sglang:prompt_tokens counter",
        f'sglang:prompt_tokens_total{{model_name="m"}} {prompt}',
        "# TYPE sglang:time_to_first_token_seconds histogram",
    ]
    for le, count in buckets.items():
        lines.append(
            f'sglang:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {count}'
        )
    total = buckets["+Inf"]
    lines.append(f'sglang:time_to_first_token_seconds_count{{model_name="m"}} {total}')
    lines.append(f'sglang:time_to_first_token_seconds_sum{{model_name="m"}} {total * 0.5}')
    return "\n".join(lines) + "\n"


def test_parse_reads_the_gauges_counters_and_buckets() -> None:
    text = exposition(queue=7, generated=1000, prompt=5000, buckets={"0.1": 2, "1.0": 6, "+Inf": 8})
    sample = metrics_parse(text, at=50.0)
    assert (sample["queue"], sample["running"], sample["cache_hit_rate"]) == (7, 3, 0.75)
    assert (sample["generation_tokens"], sample["prompt_tokens"]) == (1000, 5000)
    assert sample["ttft_buckets"] == [(0.1, 2), (1.0, 6), (float("inf"), 8)]


def test_quantiles_interpolate_within_a_bucket() -> None:
    buckets = [(0.1, 2.0), (1.0, 6.0), (float("inf"), 8.0)]
    # median: rank 4 of 8, the 2nd of 4 observations in (0.1, 1.0]: 0.1 + 0.9 x 2/4 = 0.55
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.55)
    # p25: rank 2, the top of the first bucket (0, 0.1]: 0.1
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    # p99: rank 7.92, in the +Inf bucket: the largest finite bound
    assert histogram_quantile(0.99, buckets) == 1.0
    assert histogram_quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None


def test_rates_and_quantiles_cover_the_window_between_two_scrapes() -> None:
    old = metrics_parse(
        exposition(queue=1, generated=1000, prompt=5000, buckets={"0.1": 2, "1.0": 6, "+Inf": 8}),
        at=100.0,
    )
    new = metrics_parse(
        exposition(queue=4, generated=3000, prompt=9000, buckets={"0.1": 2, "1.0": 6, "+Inf": 12}),
        at=110.0,
    )
    status = engine_status(market="m", sample=new, history=[old])
    assert status["up"] and status["queue"] == 4 and status["running"] == 3
    assert status["tokens_per_second"] == pytest.approx(200.0)  # 2000 tokens in 10 s
    assert status["prompt_tokens_per_second"] == pytest.approx(400.0)
    # the 4 requests of the window all took more than 1 s: both quantiles are the largest bound
    assert status["ttft_p50_s"] == 1.0 and status["window_s"] == pytest.approx(10.0)


def test_a_restarted_engine_has_no_rate_until_its_second_scrape() -> None:
    before = metrics_parse(
        exposition(queue=0, generated=9000, prompt=9000, buckets={"1.0": 5, "+Inf": 5}), at=1.0
    )
    after = metrics_parse(
        exposition(queue=0, generated=10, prompt=20, buckets={"1.0": 1, "+Inf": 1}), at=2.0
    )
    status = engine_status(market="m", sample=after, history=[before])
    assert status["tokens_per_second"] is None and status["window_s"] is None
    assert status["ttft_p50_s"] == pytest.approx(0.5)  # since the start: 1 observation in (0, 1]


def test_polling_a_real_engine_and_a_dead_one(unique_slug) -> None:
    with ServerThread(ServerOptions.of(port=0, speed=20, market=unique_slug)) as sim:
        status = engine_status_poll(market=unique_slug, engine_url=sim.url, now=1000.0)
    assert status["up"] and status["queue"] == 0 and status["running"] == 0
    assert engine_status_last(unique_slug) == status
    down = engine_status_poll(
        market=unique_slug, engine_url=f"http://127.0.0.1:{dead_port()}", now=1001.0
    )
    assert not down["up"] and "EngineUnavailable" in down["error"] and down["queue"] is None
    assert engine_status_last(unique_slug) == down
    assert engine_chart(unique_slug) == [[1000.0, 0, None]]  # what a console draws at first


def replica_exposition(*, queue, running, cached, prompt, generated, buckets) -> str:
    """A replica's /metrics, with its cached-token counter (both engines export it)."""
    text = exposition(queue=queue, generated=generated, prompt=prompt, buckets=buckets)
    text = text.replace(
        'sglang:num_running_reqs{model_name="m"} 3',
        f'sglang:num_running_reqs{{model_name="m"}} {running}',
    )
    return (
        text + "# TYPE sglang:cached_tokens counter\n"
        f'sglang:cached_tokens_total{{model_name="m"}} {cached}\n'
    )


class MetricsServer:
    """An HTTP server in a thread whose ``GET /metrics`` answers ``text`` (set it at will)."""

    def __init__(self) -> None:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = server.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.text = ""
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


ZERO = {"0.1": 0, "1.0": 0, "+Inf": 0}


def test_a_fleet_sums_queues_and_rates_and_merges_hit_rate_and_ttft(unique_slug) -> None:
    """Two replicas scraped twice, 10 s apart; the fleet's figures by hand:

    - queue 4 + 6 = 10, running 1 + 2 = 3;
    - hit rate: (900 + 0) cached of (1000 + 3000) prompt tokens = 0.225, not the mean of the
      replicas' own rates (0.9 and 0), 0.45;
    - output tokens/s: (200 + 100) / 10 = 30;
    - TTFT of the window: a's 4 requests in (0.1, 1.0], b's 4 in (0, 0.1]; merged, 8: the
      median (rank 4) is the top of the first bucket, 0.1; p99 (rank 7.92) in (0.1, 1.0]:
      0.1 + 0.9 x 3.92/4 = 0.982.
    """
    a, b = MetricsServer(), MetricsServer()
    replicas = [("a", a.url), ("b", b.url)]
    try:
        for server in (a, b):
            server.text = replica_exposition(
                queue=0, running=0, cached=0, prompt=0, generated=0, buckets=ZERO
            )
        engine_status_poll(market=unique_slug, engine_url="", replicas=replicas, now=100.0)
        a.text = replica_exposition(queue=4, running=1, cached=900, prompt=1000, generated=200,
                                    buckets={"0.1": 0, "1.0": 4, "+Inf": 4})  # fmt: skip
        b.text = replica_exposition(queue=6, running=2, cached=0, prompt=3000, generated=100,
                                    buckets={"0.1": 4, "1.0": 4, "+Inf": 4})  # fmt: skip
        fleet = engine_status_poll(market=unique_slug, engine_url="", replicas=replicas, now=110.0)
    finally:
        a.close()
        b.close()
    assert fleet["up"] and fleet["error"] == ""
    assert (fleet["queue"], fleet["running"]) == (10, 3)
    assert fleet["cache_hit_rate"] == pytest.approx(0.225)
    assert fleet["tokens_per_second"] == pytest.approx(30.0)
    assert fleet["ttft_p50_s"] == pytest.approx(0.1)
    assert fleet["ttft_p99_s"] == pytest.approx(0.1 + 0.9 * 3.92 / 4)
    by_id = {r["engine_id"]: r for r in fleet["replicas"]}
    assert (by_id["a"]["queue"], by_id["b"]["queue"]) == (4, 6)
    assert by_id["a"]["tokens_per_second"] == pytest.approx(20.0)


def test_a_fleet_with_a_replica_down_serves_on_the_others_and_says_which(unique_slug) -> None:
    a = MetricsServer()
    a.text = replica_exposition(queue=2, running=1, cached=10, prompt=40, generated=5, buckets=ZERO)
    dead = f"http://127.0.0.1:{dead_port()}"
    try:
        fleet = engine_status_poll(
            market=unique_slug, engine_url="", replicas=[("a", a.url), ("b", dead)], now=5.0
        )
    finally:
        a.close()
    assert fleet["up"] and fleet["queue"] == 2 and fleet["cache_hit_rate"] == pytest.approx(0.25)
    assert fleet["error"].startswith("b down: EngineUnavailable")
    assert [(r["engine_id"], r["up"]) for r in fleet["replicas"]] == [("a", True), ("b", False)]
    every = engine_status_poll(market=unique_slug, engine_url="", replicas=[("b", dead)], now=6.0)
    assert not every["up"] and every["error"].startswith("b: EngineUnavailable")
