"""Under ``CI=true``, a test that did not run fails the run.

A skip means something was not tested: locally that is fine (no PostgreSQL, no Redis), in CI it
is a hole. Skipped, xfailed and xpassed tests are listed in their own section of the summary and
the exit status becomes 1 (TESTS_FAILED).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest

CI_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


def ci_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``CI`` is set to a true value."""
    return environ.get("CI", "").strip().lower() in CI_TRUE_WORDS


class SkipsFailTheRun:
    """pytest plugin: record every test that did not run and fail the session if there is one."""

    def __init__(self) -> None:
        self.not_run: list[str] = []

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self.not_run.append(f"{report.nodeid}: skipped at collection: {_reason(report)}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
            self.not_run.append(f"{report.nodeid}: {outcome}: {report.wasxfail}")
        elif report.skipped:
            self.not_run.append(f"{report.nodeid}: skipped: {_reason(report)}")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.not_run:
            terminalreporter.section("CI=true: tests that did not run fail the run", red=True)
            for line in self.not_run:
                terminalreporter.write_line(line)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.not_run and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def register(config: pytest.Config) -> None:
    """Install the policy when ``CI`` is true; call from ``pytest_configure``."""
    if ci_enabled():
        config.pluginmanager.register(SkipsFailTheRun(), "skips-fail-the-run")
