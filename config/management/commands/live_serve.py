"""``manage.py live_serve``: Daphne plus the live publishers in one process (embedded mode).

    manage.py live_serve [--host 127.0.0.1] [--port 8000] [--rounds-jsonl PATH ...] [--no-periodic]

Serves ``config.asgi:application`` like ``daphne -b HOST -p PORT``, and once the server's event
loop runs starts ``config.embedded``: with ``--rounds-jsonl`` the follower that takes the
simulated engine's round records (``--rounds-jsonl`` of ``engines.sim.server``) and
publishes the books, round results and spend ticks; and the periodic publisher (engine status,
token-charge spend ticks, every second). Without Redis this is the only way the in-memory
channel layer reaches the browsers. Ctrl-C stops it.

A header line longer than Twisted's limit (16 KiB) is answered 431 before the connection is
closed, as uvicorn answers it; Twisted alone closes such a connection without a word.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

HEADER_TOO_LARGE = json.dumps(
    {
        "error": {
            "message": "a request header line is longer than 16384 bytes",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_header_too_large",
        }
    }
).encode()


def _header_line_too_long(channel: Any, line: bytes) -> None:
    """Twisted's ``HTTPChannel.lineLengthExceeded``: answer 431, then close."""
    channel.transport.write(
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"Content-Type: application/json\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(HEADER_TOO_LARGE), HEADER_TOO_LARGE)
    )
    channel.transport.loseConnection()


class Command(BaseCommand):
    help = "Serve the ASGI app with Daphne and run the live publishers in the same process."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--rounds-jsonl",
            type=Path,
            action="append",
            default=[],
            metavar="PATH",
            help="publish the round records an engine appends to PATH (repeat it "
            "for each replica's file)",
        )
        parser.add_argument(
            "--no-periodic",
            action="store_true",
            help="no engine-status / spend publisher (celery beat runs live_publish instead)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # daphne.server installs Twisted's asyncio reactor: import it before anything else of
        # Twisted's.
        import asyncio

        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server
        from twisted.internet import reactor
        from twisted.web.http import HTTPChannel

        # Daphne's connections are Twisted's HTTPChannel, built inside Twisted's factory: the
        # class is where a too-long header line can be answered.
        HTTPChannel.lineLengthExceeded = _header_line_too_long

        from config.asgi import application
        from config.embedded import LiveServices

        services = LiveServices(
            loop=None,
            rounds_jsonl=options["rounds_jsonl"],
            periodic=not options["no_periodic"],
        )

        def start_services() -> None:
            services.loop = asyncio.get_event_loop()  # the reactor's loop: the websockets'
            services.start()

        reactor.callWhenRunning(start_services)
        server = Server(
            application,
            endpoints=build_endpoint_description_strings(
                host=options["host"], port=options["port"]
            ),
            signal_handlers=True,
            verbosity=1,
        )
        self.stdout.write(f"Serving on http://{options['host']}:{options['port']}/ (live)")
        try:
            server.run()
        finally:
            services.stop()
