"""Fixtures the market's tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from config.celery import app as celery_app


@pytest.fixture
def eager() -> Iterator[None]:
    """Tasks run in this process (the embedded mode), whatever REDIS_URL says."""
    before = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = before
