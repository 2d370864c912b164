"""SGLang's model gateway in front of a market's replicas: smg 1.13.0 (the successor of
``sglang-router``; a Rust router built into a Python extension), run by ``python -m
engines.router`` (smg's ``launch_router`` with the control key from the environment).

The market does not route requests itself: its entry point is the gateway (or one engine), and
the gateway picks a replica per request by its policy (``prefix_hash``, the market's: a
request's first tokens pick its replica on a hash ring, the next one along while that one is
busier than the fleet; ``cache_aware`` keeps a prefix on the replica its own tree of past
requests says has it cached, while the load stays balanced; ``round_robin``, ``random``,
``power_of_two``, ``consistent_hashing``). The bid travels through it as a field,
``sampling_params.custom_params`` (``engines.contract.wire``): smg rebuilds the body from its
own typed request and keeps it. What the market sends to the replicas themselves (control,
status) goes to each replica's own URL. smg finds each worker's engine by probing it
(SGLang's ``/server_info`` and ``/model_info``, which the simulated engine serves) and watches
its load on ``/v1/loads``.

What this module sets, and why:

- **Its priority scheduler stays off** (``--priority-scheduler-enabled`` is never passed): with
  it on, smg admits requests through per-class FIFO queues of its own, so requests wait in the
  gateway, where no auction orders them, the engines' queues stay empty and bids stop mattering
  (measured: a bid of 1.0 $/s waited 4.71 s, one of 0.001 $/s 4.00 s; with it off, 1.19 s and
  3.68 s). The auction runs in the engines' queues; the gateway must pass requests straight on.
- **Its control plane takes a key, always.** smg serves its control routes on its one port
  (``POST /workers`` registers a backend by URL and ``DELETE /workers/{id}`` removes one: with
  them, whoever reaches the port decides which engines serve the market; ``/flush_cache``
  drops the engines' caches), with no credential unless given one, and a loopback address
  does not keep out the other programs and users of the host. So every gateway has
  ``control_key`` (a random one unless the caller gives one: ``live_market`` gives the engine
  admin token), which smg takes as a ``--control-plane-api-keys`` admin key: without
  ``Authorization: Bearer <key>`` the control routes, ``GET /workers`` among them, answer 401,
  while the data plane (``/generate``, ``/v1/models``) stays open. ``router_ready`` and
  ``router_wait`` send it. The key is never on a command line (``ps`` shows command lines to
  every user of the host): the command is ``python -m engines.router`` with smg's flags, which
  reads the key from ``CONTROL_KEY_ENV`` in its environment (``router_env`` puts it there),
  adds it to smg's arguments and runs smg in the same process; without it, it refuses to
  start. Its Prometheus exporter binds to loopback, on a port of its own: a free one unless
  ``prometheus_port`` says which (smg's default, 29000, would be taken by a second gateway on
  the machine: a test, a benchmark, a second market).
- **Health checks every ``health_check_interval_s``** (default 2 s; smg's own is 60 s), a
  replica leaving the rotation after ``health_failure_threshold`` failed checks (2; smg's 3),
  so that a replica that died leaves within seconds and one that came back returns.
- **A dead replica's circuit opens after ``circuit_failure_threshold`` failures** (default 2,
  smg's is 10): the gateway retries a failed request (5 times), and under ``cache_aware`` the
  retries go back to the replica that holds the prefix, dead or not, until its circuit opens
  (measured with SGLang's earlier router: at 10, 2 of the next 6 requests on a killed
  replica's prefix failed, in each of 4 trials; at 2, none). An open circuit is tried again
  after ``circuit_open_s`` (5 s; smg's 60 s), so a replica that restarted gets requests again
  within seconds.
- **Routing**: ``policy`` ``prefix_hash`` (``DEFAULT_POLICY``), chosen by the fleet benchmark
  (``benchmarks/fleet.py``; docs/engines.md, "A fleet of replicas"): at 8, 16 and 32 replicas
  and with hundreds of prefixes it had the best cache hit rate of smg's policies, a lower mean
  TTFT than ``cache_aware``, and it needs no state shared between gateways (two smg instances
  route a prefix alike), where ``cache_aware`` piled every short request that shares a common
  system prompt onto one replica. Its settings are smg's own unless ``prefix_token_count``,
  ``prefix_hash_load_factor`` or ``prefix_hash_balance_abs_threshold`` say otherwise: the first
  256 tokens, or 1024 characters of a text prompt, pick a replica on the ring, and a request
  leaves it for the least loaded replica when its load (smg's own count of the requests it has
  in flight there, nothing the engine reports) is above both 1.25 x the mean and the mean + 10
  (smg 1.13's ``policies/prefix_hash.rs``, ``load_ok``; the mean counts the incoming request).
  The absolute margin is what keeps a small fleet's hot prefix in place: with two replicas one
  must hold 22 requests more than the other before any leaves it, so ``live_market``'s demo (two
  replicas, four requests running on each) sets it to 0 and the factor to 1.0. Under
  ``cache_aware`` its thresholds are smg's own unless given (``cache_threshold`` 0.3; the
  balance gate, ``balance_abs_threshold`` 64 and ``balance_rel_threshold`` 1.5, which spills a
  request off a replica that is busier than the fleet by both). Whatever the policy, **smg's
  worker-overload protection is off** (``worker_overload_protection`` False): it leaves out of
  routing a replica with 8 or more requests waiting, and in a market waiting is the normal state
  (the queue is what bids order), so it scatters each prefix over the replicas and the cache hit
  rate falls to round robin's (the replicas benchmark, ``benchmarks/replicas.py``;
  docs/engines.md, "Replicas behind SGLang's model gateway": 2 replicas under ``cache_aware``, 2
  seeds, loads 1 and 1.5, mean TTFT 0.18 and 0.26 s against 0.25 and 0.36 s with the protection
  on).
- **No hub**: smg registers a tokenizer job for each worker's ``tokenizer_path``, which it would
  look up on a model hub; nothing outside is reachable here, and routing needs no tokenizer
  (its policies read the text or the token ids as sent), so ``HF_ENDPOINT`` points at a closed
  local port unless the caller set it.
- **Quiet, and quick to stop**: ``--log-level warn`` (smg logs two lines per request at info);
  ``--shutdown-grace-period-secs`` ``shutdown_grace_s`` (1 s; smg waits up to 180 s for
  requests in flight), so that stopping it does not hold a test or a restart.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POLICIES = (
    "cache_aware", "round_robin", "random", "power_of_two", "prefix_hash", "consistent_hashing"
)  # fmt: skip
NOWHERE = "http://127.0.0.1:9"  # the discard port: connections are refused at once
START_TIMEOUT_S = 60.0
# The market's routing: chosen by the fleet benchmark (docs/engines.md, "A fleet of replicas").
DEFAULT_POLICY = "prefix_hash"
CONTROL_KEY_ID = "market"  # the control-plane key's id and name in smg
CONTROL_KEY_ENV = "ROUTER_CONTROL_KEY"  # where ``python -m engines.router`` reads the key


@dataclass(frozen=True)
class RouterOptions:
    """How to start the gateway in front of ``worker_urls``; ``None``: smg's default. The
    cache-aware thresholds are smg's: a request goes to the replica with the longest cached
    prefix when that match is at least ``cache_threshold`` of the request (0..1), unless that
    replica's load (requests in flight) is above the fleet's mean by more than
    ``balance_abs_threshold`` and more than ``balance_rel_threshold`` times the mean, when it
    goes to the least loaded. ``worker_overload_protection`` True: smg leaves out a replica
    with 8 or more waiting or 0.8 of its KV cache in use (the market's default: off, the
    module's docstring). Times in seconds."""

    port: int
    worker_urls: tuple[str, ...]
    host: str = "127.0.0.1"
    policy: str = DEFAULT_POLICY
    cache_threshold: float | None = None
    balance_abs_threshold: int | None = None
    balance_rel_threshold: float | None = None
    worker_overload_protection: bool = False
    # prefix_hash: the request's first ``prefix_token_count`` tokens pick a replica on a hash
    # ring, the least loaded instead while that one's requests in flight are above both
    # ``prefix_hash_load_factor`` x the mean and the mean + ``prefix_hash_balance_abs_threshold``.
    prefix_token_count: int | None = None
    prefix_hash_load_factor: float | None = None
    prefix_hash_balance_abs_threshold: int | None = None
    health_check_interval_s: int = 2
    health_failure_threshold: int = 2
    circuit_failure_threshold: int = 2
    circuit_open_s: int = 5  # an open circuit is tried again after this (a replica restarted)
    log_level: str = "warn"
    prometheus_port: int | None = None  # None: a free port, chosen when the command is built
    # The control plane's admin key (the module's docstring): a random one unless given.
    control_key: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    shutdown_grace_s: int = 1

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"router policy must be one of {', '.join(POLICIES)}")
        if not self.worker_urls:
            raise ValueError("the router needs at least one worker URL")
        if self.cache_threshold is not None and not 0 <= self.cache_threshold <= 1:
            raise ValueError("cache_threshold must be in 0..1")
        if not (self.control_key or "").strip():
            raise ValueError(
                "control_key must not be blank: the router's control plane (POST /workers, "
                "DELETE /workers/{id}, /flush_cache) would be open to whoever reaches it"
            )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def router_argv(options: RouterOptions, *, python: str = sys.executable) -> list[str]:
    """The gateway's command line (smg's priority scheduler never on: the module's docstring),
    without its control key, which goes in its environment (``router_env``)."""
    metrics_port = options.prometheus_port or free_port("127.0.0.1", not_=options.port)
    argv = [
        python, "-m", "engines.router",
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
        "--shutdown-grace-period-secs", str(options.shutdown_grace_s),
    ]  # fmt: skip
    for flag, value in (
        ("--cache-threshold", options.cache_threshold),
        ("--balance-abs-threshold", options.balance_abs_threshold),
        ("--balance-rel-threshold", options.balance_rel_threshold),
        ("--prefix-token-count", options.prefix_token_count),
        ("--prefix-hash-load-factor", options.prefix_hash_load_factor),
        ("--prefix-hash-balance-abs-threshold", options.prefix_hash_balance_abs_threshold),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if not options.worker_overload_protection:
        argv.append("--disable-worker-overload-protection")
    return argv


def control_key_args(key: str) -> list[str]:
    """smg's arguments for the control plane's one key, an admin's."""
    return ["--control-plane-api-keys", f"{CONTROL_KEY_ID}:{CONTROL_KEY_ID}:admin:{key}"]


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
    url: str,
    workers: int,
    process: Any | None = None,
    *,
    timeout_s: float = START_TIMEOUT_S,
    control_key: str | None = None,
) -> None:
    """Wait until the router at ``url`` has ``workers`` healthy workers; RuntimeError when
    ``process`` (anything with ``poll`` and ``returncode``) exits first, or past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not router_ready(url, workers, control_key=control_key):
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the router exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the router at {url} had not {workers} healthy workers")
        time.sleep(0.2)


def http_wait(url: str, process: Any | None = None, *, timeout_s: float = 60.0) -> None:
    """Wait until ``url`` answers anything but a server error; RuntimeError when ``process``
    (anything with ``poll`` and ``returncode``) exits first, or past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{url}: its process exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {timeout_s:g} s")


def router_env(environ: Mapping[str, str], options: RouterOptions) -> dict[str, str]:
    """The router's environment: ``environ`` with its control key (``CONTROL_KEY_ENV``) and
    ``HF_ENDPOINT`` pointing nowhere unless set."""
    env = dict(environ)
    env.setdefault("HF_ENDPOINT", NOWHERE)
    env[CONTROL_KEY_ENV] = options.control_key
    return env


def router_ready(
    url: str, workers: int, *, timeout_s: float = 1.0, control_key: str | None = None
) -> bool:
    """Whether the router at ``url`` answers and has ``workers`` healthy workers (its control
    plane's ``GET /workers``, with ``control_key``: without it, a router answers 401 and this is
    False)."""
    request = urllib.request.Request(f"{url}/workers")
    if control_key:
        request.add_header("Authorization", f"Bearer {control_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            listed = json.load(answer).get("workers", [])
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return sum(1 for w in listed if w.get("is_healthy")) >= workers


class Router:
    """The gateway as a child process: ``start`` waits until every worker is healthy in it."""

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
                env=router_env(os.environ, self.options),
            )  # fmt: skip
        finally:
            if self.log is not None:
                out.close()  # type: ignore[union-attr]
        self.wait_ready(len(self.options.worker_urls), timeout_s=timeout_s)
        return self

    def wait_ready(self, workers: int, *, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until ``workers`` workers are healthy in the router (RuntimeError past it)."""
        router_wait(
            self.url, workers, self.process, timeout_s=timeout_s,
            control_key=self.options.control_key,
        )  # fmt: skip

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


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m engines.router SMG_FLAGS...``: smg's router, with the control key from
    ``CONTROL_KEY_ENV`` (the module's docstring); exits with a message without one."""
    key = os.environ.get(CONTROL_KEY_ENV, "")
    if not key.strip():
        sys.exit(
            f"engines.router: {CONTROL_KEY_ENV} is not set; the router will not start with its "
            "control plane (POST /workers, DELETE /workers/{id}, /flush_cache) open"
        )
    from smg.launch_router import launch_router, parse_router_args

    flags = list(sys.argv[1:] if argv is None else argv)
    launch_router(parse_router_args([*flags, *control_key_args(key)]))


if __name__ == "__main__":
    main()
