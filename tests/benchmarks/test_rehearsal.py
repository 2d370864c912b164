"""The rehearsal over network namespaces (``benchmarks.rehearsal``), run for real with a small
load: the database, engines, worker and two gateway hosts each in a namespace of their own,
sharing nothing but the service URLs. Needs root (``ip netns``), as CI has."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 20  # per gateway


def _namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="network namespaces need root and iproute2's ip",
)
def test_the_market_over_five_hosts_serves_both_gateways_and_settles_every_request(
    tmp_path,
) -> None:
    out = tmp_path / "rehearsal.json"
    # The test's own DATABASE_URL and REDIS_URL stay here: the rehearsal starts its own.
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.rehearsal", "--requests", str(REQUESTS),
         "--json", str(out), "--logs", str(tmp_path / "logs")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed
    figures = json.loads(out.read_text())

    # Every request through each gateway answered 200; both gateways served.
    assert figures["requests_per_gateway"] == {"gateway-1": REQUESTS, "gateway-2": REQUESTS}
    assert figures["answers_by_status"] == {
        "gateway-1": {"200": REQUESTS}, "gateway-2": {"200": REQUESTS}
    }  # fmt: skip
    assert figures["gateway_metrics"] == figures["answers_by_status"]  # each gateway's own count
    # The run's rows in the rehearsal's database (psycopg): every request served, each with its
    # tokens and its priority entry; the round records all consumed by the worker host.
    assert figures["requests_in_database"] == {"served": 2 * REQUESTS}
    assert figures["settled_by_gateway"] == {"gateway-1": REQUESTS, "gateway-2": REQUESTS}
    entries = figures["ledger_entries"]
    assert entries["tokens"] == entries["priority"] == 2 * REQUESTS
    assert entries["run"] == 4 * REQUESTS
    assert figures["round_records"]["written"] > 0
    assert figures["round_records"]["unread"] == figures["round_records"]["pending"] == 0
    # manage.py ledger_check on the worker host passed.
    assert figures["ledger_check"]["ok"], figures["ledger_check"]["lines"]
    assert figures["ledger_check"]["lines"][-1] == "ledger check: ok"
    assert figures["ok"]
    # The hosts were apart: each gateway's log is its own, on its own address.
    assert set(figures["hosts"]) >= {"db", "engines", "worker", "gateway-1", "gateway-2"}
    assert len(set(figures["hosts"].values())) == len(figures["hosts"])
    assert (tmp_path / "logs" / "gateway-1" / "uvicorn.log").exists()
    assert (tmp_path / "logs" / "gateway-2" / "uvicorn.log").exists()

    # Nothing is left: its namespaces (rh<pid>-...) and its temporary folder are gone.
    tag = re.search(r"in (rh\d+)-sw", printed)
    assert tag, printed
    assert not {ns for ns in _namespaces() if ns.startswith(f"{tag[1]}-")}
    folder = re.search(r"(\S+/rehearsal-\w+) deleted", printed)
    assert folder and not Path(folder[1]).exists(), printed
    assert "verdict: ok" in printed
