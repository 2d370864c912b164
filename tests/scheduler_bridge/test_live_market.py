"""The README's main command's last step: ``manage.py live_market`` runs the whole market."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from tests.conftest import REPO_ROOT, dead_port


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return reply.read()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_live_market_serves_bidding_agents_and_stops_cleanly(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'live.sqlite3'}"  # embedded defaults
    manage = [sys.executable, str(REPO_ROOT / "manage.py")]
    for step in (["migrate", "--noinput"], ["seed_demo"]):
        subprocess.run([*manage, *step], env=env, check=True, capture_output=True, timeout=120)
    web, engine = dead_port(), dead_port()
    proc = subprocess.Popen(
        [*manage, "live_market", "--port", str(web), "--engine-port", str(engine),
         "--sessions-per-minute", "240", "--var", str(tmp_path / "var")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        banner = ""
        while "Ctrl-C stops everything" not in banner and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"live_market exited early:\n{banner}"
            banner += line
        assert f"http://127.0.0.1:{web}/console/" in banner and "operator-demo-pass" in banner
        assert json.loads(_get(f"http://127.0.0.1:{web}/healthz"))["status"] == "ok"
        assert _get(f"http://127.0.0.1:{engine}/health") == b""
        # The agents' requests go through the gateway and are settled from the round records.
        rounds = tmp_path / "var" / "rounds.jsonl"
        while time.monotonic() < deadline and not (rounds.exists() and rounds.stat().st_size):
            time.sleep(0.5)
        assert rounds.exists() and rounds.stat().st_size > 0, "no round was recorded"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    # The children close their ports as they exit: wait for that, not for a fixed second.
    stopped = time.monotonic() + 15
    while (_listening(web) or _listening(engine)) and time.monotonic() < stopped:
        time.sleep(0.1)
    assert not _listening(web) and not _listening(engine), "children left behind"
