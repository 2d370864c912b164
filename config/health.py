"""Reachability of the services the project runs on: the database and Redis.

Read by the ``check_services`` command (which ``make run`` calls before migrating) and by the
``/healthz`` endpoint. A check never raises: it returns a :class:`ServiceStatus` whose message
names the service, where it is (without credentials) and the variable that configures it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from typing import Literal, TypedDict

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from config import backends

State = Literal["ok", "error"]

REDIS_TIMEOUT_S = 2.0  # seconds for Redis to accept the connection and answer PING
DISTRIBUTION = "inference-market"
# Reasons that mean "nothing answered there", as opposed to "it answered and said no".
UNREACHABLE_REASONS = frozenset({"connection refused", "timed out", "host not found"})


@dataclass(frozen=True)
class ServiceStatus:
    """The outcome of one reachability check."""

    service: str  # "PostgreSQL" or "Redis"
    variable: str  # the environment variable that configures it
    target: str  # host:port/name; never credentials
    state: State
    reason: str = ""  # short, e.g. "connection refused"

    @property
    def ok(self) -> bool:
        """It answered."""
        return self.state == "ok"

    def describe(self) -> str:
        """One line for a person."""
        if self.state == "ok":
            return f"{self.service} at {self.target}: ok"
        if self.reason in UNREACHABLE_REASONS:
            return (
                f"{self.service} at {self.target} is unreachable: {self.reason}. "
                f"Start it or fix {self.variable}."
            )
        return f"{self.service} at {self.target} failed: {self.reason}. Check {self.variable}."


class HealthReport(TypedDict):
    """The JSON body of ``/healthz``."""

    status: Literal["ok", "error"]
    database: State
    redis: State
    version: str


def database_status(connection: BaseDatabaseWrapper | None = None) -> ServiceStatus:
    """Open the database connection Django uses (or ``connection``) and run ``SELECT 1``.

    PostgreSQL connection attempts give up after ``backends.POSTGRES_CONNECT_TIMEOUT_S`` seconds.
    """
    connection = connection if connection is not None else connections[DEFAULT_DB_ALIAS]
    service = "PostgreSQL"
    target = backends.database_display(connection.settings_dict)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # a health check reports failures, it does not raise them
        return ServiceStatus(service, "DATABASE_URL", target, "error", failure_reason(exc))
    return ServiceStatus(service, "DATABASE_URL", target, "ok")


def redis_status(url: str, *, timeout_s: float = REDIS_TIMEOUT_S) -> ServiceStatus:
    """Connect to ``url`` and send PING."""
    target = backends.parse_redis_url(url).display
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        return ServiceStatus("Redis", "REDIS_URL", target, "error", failure_reason(exc))
    finally:
        client.close()
    return ServiceStatus("Redis", "REDIS_URL", target, "ok")


def service_statuses() -> list[ServiceStatus]:
    """Every configured service, database first."""
    return [database_status(), redis_status(settings.REDIS_URL)]


def health_report() -> HealthReport:
    """What ``/healthz`` answers: healthy when every configured service answers."""
    database, redis_ = service_statuses()
    return {
        "status": "ok" if database.ok and redis_.ok else "error",
        "database": database.state,
        "redis": redis_.state,
        "version": project_version(),
    }


def project_version() -> str:
    """The installed distribution's version, or "unknown" when running uninstalled."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"connection refused", re.I), "connection refused"),
    (re.compile(r"time(d)? ?out|timeout expired", re.I), "timed out"),
    (
        re.compile(
            r"could not translate host name|failed to resolve host|name or service not known"
            r"|temporary failure in name resolution",
            re.I,
        ),
        "host not found",
    ),
    (
        re.compile(r"password authentication failed|authentication|invalid username", re.I),
        "authentication failed",
    ),
]


def failure_reason(exc: BaseException) -> str:
    """A short, credential-free reason for a failed connection attempt.

    Neither libpq nor redis-py puts the password into its messages; the raw message is only
    used, trimmed to its first line, when no known pattern matches.
    """
    message = str(exc).strip()
    for pattern, reason in _PATTERNS:
        if pattern.search(message):
            return reason
    first_line = message.splitlines()[0] if message else type(exc).__name__
    # libpq: 'connection failed: connection to server at "h", port 1 failed: FATAL:  ...'
    first_line = re.sub(r"^(.* failed: )?(FATAL: +)?", "", first_line)
    return first_line.rstrip(".") or type(exc).__name__
