"""The simulated engine's real-time HTTP server, speaking SGLang's native HTTP API.

    python -m engines.sim.server --host 127.0.0.1 --port 30000 \\
        --policy dfs-auction-kv-split --reserve 0 --market default [--set name=value ...] \\
        [--redis-url URL --rounds-stream NAME] [--rounds-jsonl PATH] [--speed X] \\
        [--max-queue N] [--admin-token TOKEN]

Endpoints: ``POST /generate`` (protocol.py), ``GET /health``, ``GET /health_generate``,
``GET /model_info`` and ``GET /server_info`` (also as SGLang's older ``/get_model_info`` and
``/get_server_info``), ``GET /v1/loads`` (loads.py), ``GET /metrics`` (metrics.py) and
``POST /admin/market`` (``{"policy", "reserve", "wait_bound_s"}``, from the next round; closed
unless an admin token is set, by ``--admin-token`` or else ``ENGINE_ADMIN_TOKEN``, the variable the
market's push sends; send ``Authorization: Bearer TOKEN``). Clock and speed: realtime.py. Round
records go to an in-process callback list, a JSONL file and/or a Redis stream (the contract's
sinks, ``engines.contract.sinks``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import logging
import os
import signal
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from aiohttp import web

from engines.contract.control import follower_for
from engines.contract.knobs import MarketKnobs, split_knobs
from engines.contract.records import DEFAULT_STREAM
from engines.contract.sinks import (
    CallbackSink,
    FanoutSink,
    JsonlSink,
    RedisStreamSink,
    Sink,
)
from engines.contract.tokenizer import NAME as TOKENIZER_NAME
from engines.contract.tokenizer import default_tokenizer
from engines.contract.wire import (
    ADMIN_TOKEN_ENV,
    CONTROL_PATH,
    admin_token_from_env,
    control_read,
)
from mechanism import DEFAULT_POLICY, POLICIES

from .config import settings_split
from .engine import Engine
from .loads import LoadReport
from .metrics import CONTENT_TYPE, ServerMetrics
from .protocol import (
    answer,
    error_body,
    errors_as_json,
    json_error,
    json_response,
    loads_json,
    parse_generate,
    sse,
)
from .realtime import (
    DEFAULT_MAX_QUEUE,
    HEALTH_RID_PREFIX,
    DuplicateRequest,
    EngineClock,
    EngineDown,
    EngineLoop,
    QueueFull,
    Ticket,
)

log = logging.getLogger(__name__)

VERSION = "sim-0.1"
MAX_BODY_BYTES = 64 * 2**20
HEALTH_TIMEOUT_S = 20.0  # wall seconds /health_generate waits for a step
RETRY_AFTER_S = 1  # the Retry-After of a 429, seconds


@dataclass(frozen=True)
class ServerOptions:
    """How to run the server; the command line's options. ``speed``: engine seconds per wall s."""

    host: str = "127.0.0.1"
    port: int = 30000
    policy: str = DEFAULT_POLICY
    knobs: MarketKnobs = field(default_factory=MarketKnobs)  # the market's (the contract's)
    settings: tuple[str, ...] = ()  # EngineConfig or MarketKnobs overrides, "name=value"
    redis_url: str | None = None
    rounds_jsonl: str | None = None
    speed: float = 1.0
    max_queue: int = DEFAULT_MAX_QUEUE
    admin_token: str | None = None
    engine_id: str | None = None  # default "sim@HOST:PORT"
    # Follow the market's control store (engines.contract.control) as SGLang's plugin
    # does: the Redis key of the market at redis_url.
    follow_control: bool = False

    def __post_init__(self) -> None:
        if self.follow_control and not self.redis_url:
            raise ValueError("--follow-control needs --redis-url")

    @classmethod
    def of(cls, **values: Any) -> ServerOptions:
        """Options from flat keyword arguments: the knobs' names (``reserve``, ``market``, ...)
        and the server's own."""
        knobs, rest = split_knobs(values)
        if "settings" in rest:
            rest["settings"] = tuple(rest["settings"])
        return cls(knobs=knobs, **rest)

    @property
    def market(self) -> str:
        return self.knobs.market


class SimServer:
    """The aiohttp application around one simulated engine."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        config, knobs = settings_split(options.settings, options.knobs)
        self.tokenizer = default_tokenizer()
        self.control = (
            follower_for(market=knobs.market, redis_url=options.redis_url)
            if options.follow_control
            else None
        )
        self.engine = Engine(
            config,
            options.policy,
            knobs=knobs,
            control=self.control,
            engine_id=options.engine_id or "sim",
            label=self.tokenizer.label,
        )
        self.callbacks = CallbackSink()  # in-process consumers: append to .callbacks
        sinks: list[Sink] = [self.callbacks]
        if options.rounds_jsonl:
            sinks.append(JsonlSink(options.rounds_jsonl))
        self.redis_sink: RedisStreamSink | None = None
        if options.redis_url:
            self.redis_sink = RedisStreamSink(options.redis_url, knobs.rounds_stream)
            sinks.append(self.redis_sink)
        self.clock = EngineClock(options.speed)
        self.loop = EngineLoop(
            self.engine, clock=self.clock, sink=FanoutSink(sinks), max_queue=options.max_queue
        )
        self.model_name = f"sim/{options.market}"
        self.metrics = ServerMetrics(self.loop, self.model_name)
        self.load_report = LoadReport(self.engine, self.clock, VERSION)
        self.port = options.port
        self.app = self._app()
        self._runner: web.AppRunner | None = None

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[errors_as_json], client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health_generate)
        # What SGLang's model gateway probes to register a worker as SGLang and watch its load.
        for path in ("/model_info", "/get_model_info"):
            app.router.add_get(path, self.model_info)
        for path in ("/server_info", "/get_server_info"):
            app.router.add_get(path, self.server_info)
        app.router.add_get("/v1/loads", self.loads)
        app.router.add_get("/metrics", self.metrics_text)
        app.router.add_post(CONTROL_PATH, self.admin_market)
        return app

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> int:
        """Start the engine loop, the sinks and the listener; return the bound port."""
        if self.control is not None:
            await asyncio.to_thread(self.control.start)  # reads the store once before serving
        self.loop.sink.start()
        self.loop.start()
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.options.host, self.options.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        if self.options.engine_id is None:
            self.engine.engine_id = f"sim@{self.options.host}:{self.port}"
        return self.port

    async def stop(self) -> None:
        """Stop listening, stop the engine loop, close the sinks."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.loop.stop()
        await asyncio.to_thread(self.loop.sink.close)
        if self.control is not None:
            await asyncio.to_thread(self.control.stop)

    # --- /generate ----------------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang's ``POST /generate`` for one request, streamed or not."""
        g = parse_generate(loads_json(await request.read()))
        tokens = g.input_ids if g.input_ids is not None else tuple(self.tokenizer.encode(g.text))
        try:
            ticket = self.loop.submit(
                g.rid, tokens, g.max_new_tokens, g.bid, stream=g.stream, owner=g.owner
            )
        except DuplicateRequest as exc:
            return json_error(400, str(exc), "rid")
        except QueueFull as exc:
            return json_error(429, str(exc), None, **{"Retry-After": str(RETRY_AFTER_S)})
        except EngineDown as exc:
            return json_error(503, str(exc))
        except ValueError as exc:  # the engine refuses it: it can never fit the KV cache
            message = f"prompt ({len(tokens)} tokens) + max_new_tokens ({g.max_new_tokens}) "
            return json_error(
                400, message + f"can never fit: {exc}", "sampling_params.max_new_tokens"
            )
        try:
            if g.stream:
                return await self._stream(request, ticket)
            return await self._complete(ticket)
        except asyncio.CancelledError:
            self.loop.abandon(ticket)  # the client went away
            raise

    async def _complete(self, ticket: Ticket) -> web.Response:
        while (event := await ticket.events.get()) is not None:
            if isinstance(event, EngineDown):
                return json_error(503, str(event))
        req = ticket.req
        return json_response(answer(req, req.generated, self.tokenizer.decode(req.output)))

    async def _stream(self, request: web.Request, ticket: Ticket) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        req, pieces, sent = ticket.req, [], 0
        try:
            while (event := await ticket.events.get()) is not None:
                if isinstance(event, EngineDown):
                    await response.write(sse(error_body(503, str(event))))
                    break
                while sent < event:
                    pieces.append(self.tokenizer.piece(req.output[sent]))
                    sent += 1
                await response.write(sse(answer(req, sent, "".join(pieces))))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:
            self.loop.abandon(ticket)
        return response

    # --- probes and information ---------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        """200 with an empty body while the engine loop runs (SGLang's ``/health``)."""
        if not self.loop.alive:
            return json_error(503, "the engine is not running")
        return web.Response(status=200, text="")

    async def health_generate(self, request: web.Request) -> web.Response:
        """200 once the engine has run a step since the probe: a 1-token request, or any other."""
        loop = self.loop
        before = loop.steps_done
        ticket = None
        try:
            ticket = loop.submit(HEALTH_RID_PREFIX + uuid.uuid4().hex, (1,), 1, 0.0, stream=False)
        except QueueFull:
            pass  # a full queue still answers healthy if the engine makes progress
        except EngineDown as exc:
            return json_error(503, str(exc))
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                event: int | EngineDown | None = 0  # 0: no news of the probe
                if ticket is None:
                    await asyncio.sleep(0.05)
                else:
                    with contextlib.suppress(TimeoutError):
                        event = await asyncio.wait_for(ticket.events.get(), 0.05)
                if isinstance(event, EngineDown):
                    return json_error(503, str(event))
                if event is None or (loop.steps_done > before + 1 and loop.alive):
                    return web.Response(status=200, text="")  # the probe finished, or a step ran
            return json_error(503, f"the engine ran no step in {HEALTH_TIMEOUT_S:g} s")
        finally:
            if ticket is not None:
                loop.abandon(ticket)

    async def model_info(self, request: web.Request) -> web.Response:
        """SGLang's ``/model_info``, with the market's policy and reserve ($/s)."""
        return json_response(
            {
                "model_path": self.model_name,
                "served_model_name": self.model_name,
                "tokenizer_path": TOKENIZER_NAME,
                "is_generation": True,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "market": self.options.market,
                "policy": self.engine.policy,
                "reserve": self.engine.reserve,
                "wait_bound_s": self.engine.knobs.wait_bound_s,
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        """SGLang's ``/server_info``: the options and the engine's configuration, under
        SGLang's names where SGLang has one (one rank: no tensor, pipeline or data
        parallelism; no prefill/decode disaggregation)."""
        cfg = self.engine.config
        return json_response(
            {
                "version": VERSION,
                "model_path": self.model_name,
                "served_model_name": self.model_name,
                "tp_size": 1,
                "pp_size": 1,
                "dp_size": 1,
                "disaggregation_mode": "null",
                "is_embedding": False,
                "host": self.options.host,
                "port": self.port,
                "engine_id": self.engine.engine_id,
                "market": self.options.market,
                "policy": self.engine.policy,
                "reserve": self.engine.reserve,
                "wait_bound_s": self.engine.knobs.wait_bound_s,
                "speed": self.clock.speed,
                "clock": "engine seconds = start Unix time + elapsed wall seconds x speed",
                "max_queue": self.loop.max_queue,
                "rounds_stream": self.engine.knobs.rounds_stream if self.redis_sink else None,
                "max_total_num_tokens": cfg.kv_capacity_tokens,
                "max_running_requests": cfg.max_running_requests,
                "max_prefill_tokens": cfg.max_prefill_tokens,
                "chunked_prefill_size": cfg.chunked_prefill_size,
                "prefill_tokens_per_second": self.engine.tokens_per_second,
                "engine_config": asdict(cfg),
                "market_knobs": asdict(self.engine.knobs),
            }
        )

    async def loads(self, request: web.Request) -> web.Response:
        """SGLang's ``/v1/loads`` (loads.py), JSON only."""
        return json_response(self.load_report.body(request.query.get("include")))

    async def metrics_text(self, request: web.Request) -> web.Response:
        """Prometheus text exposition (metrics.py lists the names)."""
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    # --- control ------------------------------------------------------------------------------

    async def admin_market(self, request: web.Request) -> web.Response:
        """Set the policy and/or the reserve ($/s); they apply from the next round.

        Closed (403) unless the engine has an admin token, and the token is required (401):
        whoever reaches an engine must not set its prices. An engine that follows the market's
        control store keeps the store's values: a change made here lasts until the next poll.
        """
        token = self.options.admin_token
        if not token:
            return json_error(
                403,
                f"the market's control is closed on this engine: start it with --admin-token"
                f" or {ADMIN_TOKEN_ENV} to open it",
            )
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            return json_error(401, "a valid admin token is required (Authorization: Bearer ...)")
        policy, reserve, wait_bound_s = control_read(  # ControlError: a 400
            loads_json(await request.read()),
            policy=self.engine.policy,
            reserve=self.engine.reserve,
            wait_bound_s=self.engine.knobs.wait_bound_s,
        )
        self.engine.set_policy(policy)
        self.engine.set_reserve(reserve)
        self.engine.set_wait_bound(wait_bound_s)
        if self.control is not None:
            self.control.overridden()  # the store's values come back at the next poll
        log.info(
            "market %s: policy %s, reserve %g $/s, wait bound %g s",
            self.options.market, policy, reserve, wait_bound_s,
        )  # fmt: skip
        return json_response({"policy": policy, "reserve": reserve, "wait_bound_s": wait_bound_s})


# --- the command line -----------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> ServerOptions:
    """Options from the command line; exits with a message on bad values."""
    p = argparse.ArgumentParser(
        prog="python -m engines.sim.server",
        description="The simulated engine, serving SGLang's native HTTP API.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--policy", default=DEFAULT_POLICY, choices=list(POLICIES))
    p.add_argument("--reserve", type=float, default=0.0, help="reserve price, $/s of waiting")
    p.add_argument("--market", default="default", help="market slug (model_path is sim/MARKET)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="NAME=VALUE",
                   help="override an EngineConfig or MarketKnobs field (repeatable)")  # fmt: skip
    p.add_argument("--redis-url", default=None, help="send round records to a Redis stream")
    p.add_argument("--rounds-stream", default=DEFAULT_STREAM)
    p.add_argument("--rounds-jsonl", default=None, metavar="PATH", help="also append records")
    p.add_argument("--follow-control", action="store_true",
                   help="follow the market's control store in Redis")  # fmt: skip
    p.add_argument("--speed", type=float, default=1.0, help="engine seconds per wall second")
    p.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE)
    p.add_argument("--admin-token", default=None, help=f"default: ${ADMIN_TOKEN_ENV}")
    p.add_argument("--engine-id", default=None)
    p.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    fields = {k: v for k, v in vars(a).items() if k != "log_level"}
    try:
        options = ServerOptions.of(**fields)
        settings_split(options.settings, options.knobs)
        EngineClock(a.speed)
    except ValueError as exc:
        p.error(str(exc))
    if a.max_queue < 1:
        p.error("--max-queue must be >= 1")
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    if a.admin_token is None:
        options = replace(options, admin_token=admin_token_from_env(os.environ))
    return options


async def serve(options: ServerOptions) -> None:
    """Run until SIGINT or SIGTERM."""
    server = SimServer(options)
    port = await server.start()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    log.info(
        "simulated engine %s on http://%s:%d/ (policy %s, reserve %g $/s, speed %gx)",
        server.model_name, options.host, port, options.policy, options.knobs.reserve, options.speed,
    )  # fmt: skip
    await stop.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
