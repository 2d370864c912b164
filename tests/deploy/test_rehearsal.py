"""The rehearsal over network namespaces (``tests.deploy.rehearsal``), run for real with a small
load. Needs root (``ip netns``), as CI has."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

REQUESTS = 10  # per gateway


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_two_gateways_on_their_own_hosts_serve_every_request_into_one_clean_ledger(
    tmp_path,
) -> None:
    out, tmp = tmp_path / "rehearsal.json", tmp_path / "tmp"
    tmp.mkdir()
    # Its temporary folder in tmp; the test's DATABASE_URL and REDIS_URL unused: it starts its own.
    run = subprocess.Popen(
        [sys.executable, "-m", "tests.deploy.rehearsal", "--requests", str(REQUESTS),
         "--json", str(out)],
        cwd=REPO_ROOT, env={**os.environ, "TMPDIR": str(tmp)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    printed, _ = run.communicate(timeout=240)
    assert run.returncode == 0, printed
    figures = json.loads(out.read_text())

    # Every request through each gateway answered 200.
    assert figures["answers"] == {"gateway-1": {"200": REQUESTS}, "gateway-2": {"200": REQUESTS}}
    # In the rehearsal's database: every request of the run served, each charged its tokens and
    # its priority once; manage.py ledger_check on the worker host passed.
    assert figures["requests_in_database"] == {"served": 2 * REQUESTS}
    assert figures["ledger_entries"] == {"priority": 2 * REQUESTS, "tokens": 2 * REQUESTS}
    assert figures["ledger_check"]["ok"] and figures["ledger_check"]["lines"][-1] == (
        "ledger check: ok"
    )
    # Nothing is left: its namespaces (rh<pid>-...) and its temporary folder are gone.
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert f"rh{run.pid}-" not in listed.stdout
    assert not list(tmp.iterdir())
