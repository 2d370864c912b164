"""Several simulated engines in one process, each its own server on its own port.

    python -m engines.sim.many --port 30001 --port 30002 ... [--engine-id-prefix rep-] \\
        [--rounds-dir DIR] [any option of engines.sim.server but --port, --engine-id, \\
        --rounds-jsonl]

A fleet benchmark puts 32 replicas behind the gateway; 32 Python processes would spend this
machine's cores on their own overhead. Here each engine is a ``SimServer`` of its own (its own
engine, clock, queue, round records and HTTP listener), so the gateway sees as many workers as
there are ports, and all of them share one event loop. Engine ``i`` is named
``<prefix><first-index + i>`` and, with ``--rounds-dir``, writes its round records to
``<dir>/<engine id>.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from dataclasses import replace
from pathlib import Path

from .server import ServerOptions, SimServer, parse_args

log = logging.getLogger(__name__)


def split_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """This module's own options, and the rest (``engines.sim.server``'s)."""
    p = argparse.ArgumentParser(prog="python -m engines.sim.many", description=__doc__)
    p.add_argument("--port", dest="ports", type=int, action="append", required=True)
    p.add_argument("--engine-id-prefix", default="rep-")
    p.add_argument("--first-index", type=int, default=0)
    p.add_argument("--rounds-dir", type=Path, default=None)
    return p.parse_known_args(argv)


def engine_options(argv: list[str] | None = None) -> list[ServerOptions]:
    """One engine's options per ``--port``: the server's options, each with its port, id and
    round-record file."""
    own, rest = split_args(argv)
    if any(p <= 0 for p in own.ports) or len(set(own.ports)) != len(own.ports):
        raise SystemExit("engines.sim.many: --port values must be distinct and positive")
    base = parse_args(rest)
    out = []
    for i, port in enumerate(own.ports):
        engine_id = f"{own.engine_id_prefix}{own.first_index + i}"
        rounds = str(own.rounds_dir / f"{engine_id}.jsonl") if own.rounds_dir else None
        out.append(replace(base, port=port, engine_id=engine_id, rounds_jsonl=rounds))
    return out


async def serve_all(options: list[ServerOptions]) -> None:
    """Run every engine until SIGINT or SIGTERM."""
    servers = [SimServer(o) for o in options]
    for server in servers:
        await server.start()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    log.info("%d simulated engines on ports %s", len(servers), [s.port for s in servers])
    await stop.wait()
    for server in servers:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve_all(engine_options(argv)))


if __name__ == "__main__":
    main()
