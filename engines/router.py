"""SGLang's router in front of a market's replicas: ``sglang-router`` 0.3.2, a Rust binary in
its wheel, started as ``python -m sglang_router.launch_router``.

The market does not route requests itself: its entry point is the router (or one engine), and
the router picks a replica per request by its policy (``cache_aware`` keeps a prefix on the
replica that has it cached while the load stays balanced; ``round_robin``, ``random``,
``power_of_two``). The bid survives it in the rid (``scheduler_bridge.contract.wire``); what the
market sends to the replicas themselves (control, status) goes to each replica's own URL.

What this module sets, and why:

- **No hub**: the router loads a tokenizer for the workers' model at start and tries a model
  hub for it; nothing outside is reachable here and the simulated engines' model is not on any
  hub, so ``HF_ENDPOINT`` points at a closed local port unless the caller set it (the router
  then logs one warning and routes by text, which is what ``cache_aware`` needs).
- **Health checks every ``health_check_interval_s``** (default 2 s, the router's own is 60 s),
  so that a replica that died leaves the rotation within seconds, and one that came back
  returns to it.
- **A dead replica's circuit opens after ``circuit_failure_threshold`` failures** (default 2,
  the router's own is 10): the router retries a failed request (5 times by default), but under
  ``cache_aware`` the retries go back to the replica that holds the prefix, dead or not, until
  its circuit opens; with the replica that holds a prefix killed, 2 of the next 6 requests on
  that prefix failed at the router's 10 (in each of 4 trials) and none at 2. An open circuit is
  tried again after ``circuit_open_s`` (5 s; the router's default is 60 s), so a replica that
  restarted gets requests again within seconds.
- **Quiet**: ``--log-level warn`` (the router logs two lines per request at info).
- **Its own metrics port**: the router serves Prometheus metrics on a port of its own, 29000
  unless told; a second router on the machine (a test, a benchmark, a second market) would find
  it taken and exit, so each gets a free one unless ``prometheus_port`` says which.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")
NOWHERE = "http://127.0.0.1:9"  # the discard port: connections are refused at once
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RouterOptions:
    """How to start the router in front of ``worker_urls``; ``None``: the router's default.
    The cache-aware thresholds are the router's: a request goes to the replica with the longest
    cached prefix when that match is at least ``cache_threshold`` of the request (0..1), unless
    the load is unbalanced (the busiest replica has more than ``balance_abs_threshold`` requests
    and ``balance_rel_threshold`` times the idlest's), when it goes to the idlest."""

    port: int
    worker_urls: tuple[str, ...]
    host: str = "127.0.0.1"
    policy: str = "cache_aware"
    cache_threshold: float | None = None
    balance_abs_threshold: int | None = None
    balance_rel_threshold: float | None = None
    health_check_interval_s: int = 2
    health_failure_threshold: int = 2
    circuit_failure_threshold: int = 2
    circuit_open_s: int = 5  # an open circuit is tried again after this (a replica restarted)
    log_level: str = "warn"
    prometheus_port: int | None = None  # None: a free port, chosen when the command is built

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"router policy must be one of {', '.join(POLICIES)}")
        if not self.worker_urls:
            raise ValueError("the router needs at least one worker URL")
        if self.cache_threshold is not None and not 0 <= self.cache_threshold <= 1:
            raise ValueError("cache_threshold must be in 0..1")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def router_argv(options: RouterOptions, *, python: str = sys.executable) -> list[str]:
    """The router's command line."""
    metrics_port = options.prometheus_port or free_port(options.host, not_=options.port)
    argv = [
        python, "-m", "sglang_router.launch_router",
        "--host", options.host, "--port", str(options.port),
        "--worker-urls", *options.worker_urls,
        "--policy", options.policy,
        "--health-check-interval-secs", str(options.health_check_interval_s),
        "--health-failure-threshold", str(options.health_failure_threshold),
        "--cb-failure-threshold", str(options.circuit_failure_threshold),
        "--cb-timeout-duration-secs", str(options.circuit_open_s),
        "--log-level", options.log_level,
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(metrics_port),
    ]  # fmt: skip
    for flag, value in (
        ("--cache-threshold", options.cache_threshold),
        ("--balance-abs-threshold", options.balance_abs_threshold),
        ("--balance-rel-threshold", options.balance_rel_threshold),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free on ``host`` a moment ago (bound all at once, so none is
    handed out twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port(host: str = "127.0.0.1", *, not_: int | None = None) -> int:
    """A TCP port free on ``host`` a moment ago, other than ``not_`` (the router's own, which
    may well be free too until the router binds it)."""
    return next(p for p in free_ports(2, host) if p != not_)


def router_wait(
    url: str, workers: int, process: Any | None = None, *, timeout_s: float = START_TIMEOUT_S
) -> None:
    """Wait until the router at ``url`` has ``workers`` healthy workers; RuntimeError when
    ``process`` (anything with ``poll`` and ``returncode``) exits first, or past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not router_ready(url, workers):
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the router exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the router at {url} had not {workers} healthy workers")
        time.sleep(0.2)


def router_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The router's environment: ``environ`` with ``HF_ENDPOINT`` pointing nowhere unless set."""
    env = dict(environ)
    env.setdefault("HF_ENDPOINT", NOWHERE)
    return env


def router_ready(url: str, workers: int, *, timeout_s: float = 1.0) -> bool:
    """Whether the router at ``url`` answers and has ``workers`` healthy workers."""
    try:
        with urllib.request.urlopen(f"{url}/workers", timeout=timeout_s) as answer:
            listed = json.load(answer).get("workers", [])
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return sum(1 for w in listed if w.get("is_healthy")) >= workers


class Router:
    """The router as a child process: ``start`` waits until every worker is healthy in it."""

    def __init__(self, options: RouterOptions, *, log: Path | None = None) -> None:
        self.options = options
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.options.url

    def start(self, *, timeout_s: float = START_TIMEOUT_S) -> Router:
        out = subprocess.DEVNULL if self.log is None else self.log.open("ab")
        try:
            self.process = subprocess.Popen(
                router_argv(self.options), stdout=out, stderr=subprocess.STDOUT,
                env=router_env(os.environ),
            )  # fmt: skip
        finally:
            if self.log is not None:
                out.close()  # type: ignore[union-attr]
        self.wait_ready(len(self.options.worker_urls), timeout_s=timeout_s)
        return self

    def wait_ready(self, workers: int, *, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until ``workers`` workers are healthy in the router (RuntimeError past it)."""
        router_wait(self.url, workers, self.process, timeout_s=timeout_s)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def __enter__(self) -> Router:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def worker_urls(ports: Sequence[int], host: str = "127.0.0.1") -> tuple[str, ...]:
    """The base URLs of engines on ``ports``."""
    return tuple(f"http://{host}:{port}" for port in ports)
