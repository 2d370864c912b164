"""``config.launch``: what a program's previous run left in its process group is stopped before
the program starts again; ``--after`` holds the start until a URL answers. Real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil

from tests.conftest import REPO_ROOT, dead_port

# A program that starts a child of its own (as uvicorn starts its workers), prints its pid,
# then sleeps; the child ignores SIGTERM, so only SIGKILL ends it.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _launch(pidfile: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "config.launch", "--pidfile", str(pidfile), *args],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def test_what_a_killed_program_left_is_stopped_before_it_starts_again(tmp_path) -> None:
    pidfile = tmp_path / "run" / "web.pid"
    first = _launch(pidfile, "--", sys.executable, "-c", PARENT)
    try:
        assert first.stdout is not None
        orphan = int(first.stdout.readline())
        assert int(pidfile.read_text()) == first.pid == os.getpgid(orphan)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        assert _running(orphan)  # what supervisord sees: the program exited, its child did not
        began = time.monotonic()
        second = _launch(pidfile, "--", sys.executable, "-c", "print('started', flush=True)")
        assert second.stdout is not None
        assert second.stdout.readline() == "started\n"
        # The orphan ignored SIGTERM: SIGKILL after the grace period, before the start.
        assert not _running(orphan) and time.monotonic() - began >= 5.0
        assert second.wait(timeout=10) == 0
        assert int(pidfile.read_text()) == second.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)  # what a failed assertion left


def test_after_holds_the_start_until_the_url_answers(tmp_path) -> None:
    port = dead_port()
    fresh = tmp_path / "metrics"
    fresh.mkdir()
    (fresh / "counter_1234.db").write_text("an earlier run's")
    launched = _launch(
        tmp_path / "router.pid", "--fresh", str(fresh), "--after",
        f"http://127.0.0.1:{port}/health", "--", sys.executable, "-c", "print('started')",
    )  # fmt: skip
    time.sleep(2)
    assert launched.poll() is None  # still waiting: nothing listens there

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out, _ = launched.communicate(timeout=20)
    finally:
        server.shutdown()
        server.server_close()
    assert out == "started\n" and launched.returncode == 0
    assert fresh.is_dir() and not list(fresh.iterdir())
