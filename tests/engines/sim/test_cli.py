"""``python -m engines.sim.server``: serves, stops on SIGTERM, refuses bad options."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from engines.sim.server import parse_args
from tests.conftest import REPO_ROOT, dead_port


def test_the_command_serves_and_stops_on_sigterm() -> None:
    port = dead_port()
    args = [
        sys.executable,
        "-m",
        "engines.sim.server",
        "--port",
        str(port),
        "--policy",
        "fcfs",
        "--reserve",
        "0.01",
        "--market",
        "cli",
        "--speed",
        "50",
        "--set",
        "max_running_requests=4",
        "--set",
        "lpm_fcfs_fallback=true",
        "--set",
        "in_batch_defer_tokens=0",  # one of the market's knobs, not the engine's
    ]
    proc = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        info = httpx.get(f"{url}/get_model_info").json()
        assert (info["model_path"], info["policy"], info["reserve"]) == ("sim/cli", "fcfs", 0.01)
        server = httpx.get(f"{url}/get_server_info").json()
        assert server["max_running_requests"] == 4
        assert server["engine_config"]["lpm_fcfs_fallback"] is True
        assert "in_batch_defer_tokens" not in server["engine_config"]
        knobs = server["market_knobs"]
        assert (knobs["in_batch_defer_tokens"], knobs["reserve"], knobs["market"]) == (
            0,
            0.01,
            "cli",
        )
        assert server["speed"] == 50
        r = httpx.post(
            f"{url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}
        )
        assert r.json()["meta_info"]["completion_tokens"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out.decode()


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (["--set", "warp_drive=1"], "unknown engine setting"),
        (["--set", "max_running_requests=lots"], "needs a int"),
        (["--policy", "cheapest"], "invalid choice"),
        (["--reserve", "-1"], "reserve must be >= 0"),
        (["--reserve", "2e6"], "reserve must be <= 1e+06"),
        (["--set", "overhead_tokens=1.5"], "overhead_tokens needs a int"),
        (["--set", "in_batch_defer_tokens=-1"], "in_batch_defer_tokens must be an integer >= 0"),
        (["--speed", "0"], "speed must be"),
        (["--max-queue", "0"], "--max-queue must be >= 1"),
        (["--follow-control"], "--follow-control needs --redis-url"),
    ],
)
def test_bad_options_exit_with_a_message(bad, words, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(bad)
    assert exit_.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize(
    ("environ", "argv", "token"),
    [
        ({}, [], None),
        ({"ENGINE_ADMIN_TOKEN": " s3cret "}, [], "s3cret"),  # stripped, as Django does
        ({"SIM_ADMIN_TOKEN": "old"}, [], None),  # the old name is not read: one name
        ({"ENGINE_ADMIN_TOKEN": "new"}, ["--admin-token", "given"], "given"),
        ({"ENGINE_ADMIN_TOKEN": "  "}, [], None),  # blank: unset
    ],
)
def test_the_admin_token_is_the_one_the_market_sends(environ, argv, token, monkeypatch) -> None:
    """The engine asks for the token the console's push sends (``ENGINE_ADMIN_TOKEN``, as
    ``config.settings`` reads it), and no other variable."""
    for name in ("ENGINE_ADMIN_TOKEN", "SIM_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert parse_args(argv).admin_token == token
