"""The CI rule itself: under CI=true a skipped or xfailed test fails the run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ci_policy import ci_enabled
from tests.conftest import REPO_ROOT

INNER_CONFTEST = """
from tests import ci_policy


def pytest_configure(config):
    ci_policy.register(config)
"""


def run_inner_session(tmp_path: Path, test_source: str, *, ci: str | None) -> tuple[int, str]:
    """Run a separate pytest session on ``test_source`` with our policy; return (rc, output)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(INNER_CONFTEST)
    (tmp_path / "test_inner.py").write_text(test_source)
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "DJANGO_SETTINGS_MODULE"}}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if ci is not None:
        env["CI"] = ci
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:django",
            "-p",
            "no:cacheprovider",
            "-c",
            str(tmp_path / "pytest.ini"),
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, result.stdout + result.stderr


SKIPPING = """
import pytest

def test_runs():
    pass

def test_needs_a_service():
    pytest.skip("no service here")
"""

XFAILING = """
import pytest

@pytest.mark.xfail(reason="known bug")
def test_known_bug():
    assert False
"""

PASSING = """
def test_runs():
    pass
"""


def test_skip_fails_the_run_under_ci(tmp_path: Path) -> None:
    rc, output = run_inner_session(tmp_path, SKIPPING, ci="true")
    assert rc == 1, output
    assert "tests that did not run fail the run" in output
    assert "test_needs_a_service: skipped: no service here" in output


def test_skip_is_fine_outside_ci(tmp_path: Path) -> None:
    rc, output = run_inner_session(tmp_path, SKIPPING, ci=None)
    assert rc == 0, output
    assert "1 passed, 1 skipped" in output


def test_xfail_fails_the_run_under_ci(tmp_path: Path) -> None:
    rc, output = run_inner_session(tmp_path, XFAILING, ci="true")
    assert rc == 1, output
    assert "test_known_bug: xfailed: known bug" in output


def test_all_passing_passes_under_ci(tmp_path: Path) -> None:
    rc, output = run_inner_session(tmp_path, PASSING, ci="true")
    assert rc == 0, output


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("1", True), ("TRUE", True), ("false", False), ("0", False), ("", False)],
)
def test_ci_enabled(value: str, expected: bool) -> None:
    assert ci_enabled({"CI": value}) is expected
