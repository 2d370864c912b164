"""Shared fixtures and the rules for tests that need real services.

Markers (declared in pyproject.toml): ``postgres`` and ``redis`` tests skip, with a reason, when
DATABASE_URL / REDIS_URL do not point at those services; ``celery_worker`` tests need Redis too.
Under ``CI=true`` any skip fails the run (tests/ci_policy.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from tests import ci_policy

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVICE_VARIABLES = ("DATABASE_URL", "REDIS_URL")


def pytest_configure(config: pytest.Config) -> None:
    ci_policy.register(config)


def pytest_runtest_setup(item: pytest.Item) -> None:
    from django.conf import settings

    if item.get_closest_marker("postgres") and settings.DATABASES["default"]["ENGINE"] != (
        "django.db.backends.postgresql"
    ):
        pytest.skip("needs PostgreSQL: set DATABASE_URL=postgres://... (.ci/run does)")
    needs_redis = item.get_closest_marker("redis") or item.get_closest_marker("celery_worker")
    if needs_redis and not settings.REDIS_URL:
        pytest.skip("needs Redis: set REDIS_URL=redis://... (.ci/run does)")


def dead_port() -> int:
    """A loopback TCP port nothing listens on (it was free a moment ago)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


ManageRunner = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_manage() -> ManageRunner:
    """Run ``manage.py`` in a fresh process with only the given service variables set."""

    def run(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        environ = {k: v for k, v in os.environ.items() if k not in SERVICE_VARIABLES}
        environ.update(env or {})
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO_ROOT,
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run
