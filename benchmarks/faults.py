"""Faults injected into the real services: a TCP proxy in front of PostgreSQL or Redis that a
test or the soak (``benchmarks.soak``) takes down, brings back, or whose connections it cuts.

The service behind stays real (the tests' PostgreSQL, the tests' Redis); only the road to it
breaks, as it does when a database server restarts or a network drops:

- :meth:`TcpProxy.down`: no connection is accepted any more (refused) and every open one is
  closed, as when the server is stopped;
- :meth:`TcpProxy.up`: connections are accepted again on the same port (the server is back);
- :meth:`TcpProxy.cut`: every open connection is closed, new ones are accepted (a failover, or a
  server restart shorter than a client's reconnect).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.parse
from collections.abc import Iterator


class TcpProxy:
    """Forwards connections on ``127.0.0.1:port`` to ``target`` (host, port), each by two
    threads copying bytes, until told otherwise."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = 0

    def start(self) -> TcpProxy:
        self.up()
        return self

    def up(self) -> None:
        """Accept connections (again) on the proxy's port."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Refuse new connections and close the open ones."""
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        self.cut()

    def cut(self) -> None:
        """Close every open connection (both sides); new ones are still accepted."""
        with self._lock:
            doomed, self._open = self._open, set()
        for sock in doomed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.down()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # taken down
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # taken down meanwhile
                    client.close()
                    server.close()
                    return
                self._open |= {client, server}
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._open -= {src, dst}


@contextlib.contextmanager
def proxied(host: str, port: int) -> Iterator[TcpProxy]:
    """A started proxy to ``host:port``, closed after."""
    proxy = TcpProxy((host, port)).start()
    try:
        yield proxy
    finally:
        proxy.close()


def via(url: str, proxy: TcpProxy) -> str:
    """``url`` (a database or Redis URL) pointed at ``proxy`` instead of its own host and port;
    credentials, path and query kept."""
    parts = urllib.parse.urlsplit(url)
    auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{proxy.port}"))
