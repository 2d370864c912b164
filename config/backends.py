"""The services the settings point at, from their URLs: ``DATABASE_URL`` into Django's
``DATABASES`` entry, ``REDIS_URL`` into the Celery, Channels and cache settings. Pure
functions with errors that name the variable and never echo a password; ``config.env`` reads
the variables and calls them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from config.errors import EnvironmentVariableError

POSTGRES_SCHEMES = ("postgres", "postgresql")
REDIS_SCHEMES = ("redis", "rediss")
POSTGRES_DEFAULT_PORT = 5432
REDIS_DEFAULT_PORT = 6379
# Seconds a PostgreSQL connection attempt may take before it fails (libpq's connect_timeout).
POSTGRES_CONNECT_TIMEOUT_S = 5
# libpq connection parameters accepted as ?key=value in DATABASE_URL (passed to psycopg).
POSTGRES_QUERY_OPTIONS = frozenset(
    {
        "application_name",
        "connect_timeout",
        "options",
        "sslcert",
        "sslkey",
        "sslmode",
        "sslrootcert",
        "target_session_attrs",
    }
)
DATABASE_URL_FORMS = "postgres://USER:PASSWORD@HOST:PORT/NAME"
REDIS_URL_FORMS = "redis://[:PASSWORD@]HOST[:PORT][/DB] or rediss://..."


@dataclass(frozen=True)
class RedisURL:
    """A validated Redis URL. ``url`` goes to the libraries; ``display`` is safe to print."""

    url: str
    host: str
    port: int
    db: int
    tls: bool

    @property
    def display(self) -> str:
        """``host:port/db`` without credentials."""
        return f"{_host_for_display(self.host)}:{self.port}/{self.db}"


def parse_database_url(value: str) -> dict[str, Any]:
    """Turn ``DATABASE_URL`` into a Django ``DATABASES["default"]`` entry (PostgreSQL)."""
    variable = "DATABASE_URL"
    parts = _split(value, variable, DATABASE_URL_FORMS)
    if parts.scheme not in POSTGRES_SCHEMES:
        raise EnvironmentVariableError(
            variable,
            f"has unsupported scheme {parts.scheme!r}; expected {DATABASE_URL_FORMS}",
        )
    host = _require_host(parts, variable, DATABASE_URL_FORMS)
    port = _port(parts, variable, default=POSTGRES_DEFAULT_PORT)
    raw_name = parts.path.removeprefix("/")
    if not raw_name:
        raise EnvironmentVariableError(
            variable, f"has no database name; expected {DATABASE_URL_FORMS}"
        )
    if "/" in raw_name:
        raise EnvironmentVariableError(
            variable, "has a database name containing '/'; percent-encode it as %2F"
        )
    name = unquote(raw_name)
    options: dict[str, Any] = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}
    for key, option in parse_qsl(parts.query, keep_blank_values=True):
        if key not in POSTGRES_QUERY_OPTIONS:
            supported = ", ".join(sorted(POSTGRES_QUERY_OPTIONS))
            raise EnvironmentVariableError(
                variable, f"has unsupported query parameter {key!r}; supported: {supported}"
            )
        options[key] = option
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(port),
        "OPTIONS": options,
    }


def parse_redis_url(value: str) -> RedisURL:
    """Validate ``REDIS_URL``; the original string is kept for the client libraries."""
    variable = "REDIS_URL"
    parts = _split(value, variable, REDIS_URL_FORMS)
    if parts.scheme not in REDIS_SCHEMES:
        raise EnvironmentVariableError(
            variable, f"has unsupported scheme {parts.scheme!r}; expected {REDIS_URL_FORMS}"
        )
    host = _require_host(parts, variable, REDIS_URL_FORMS)
    port = _port(parts, variable, default=REDIS_DEFAULT_PORT)
    db_text = parts.path.strip("/")
    if db_text and not (db_text.isascii() and db_text.isdigit()):
        raise EnvironmentVariableError(
            variable, "has a database number that is not a non-negative integer (e.g. /0)"
        )
    return RedisURL(
        url=value,
        host=host,
        port=port,
        db=int(db_text) if db_text else 0,
        tls=parts.scheme == "rediss",
    )


def _split(value: str, variable: str, forms: str) -> SplitResult:
    """``urlsplit`` with the scheme lower-cased and errors that name the variable."""
    if "://" not in value:
        raise EnvironmentVariableError(variable, f"is not a URL (no '://'); expected {forms}")
    try:
        parts = urlsplit(value)
    except ValueError:
        # urlsplit's own message may quote the URL, and with it a password.
        raise EnvironmentVariableError(
            variable, f"could not be parsed (check brackets around IPv6 hosts); expected {forms}"
        ) from None
    return parts._replace(scheme=parts.scheme.lower())


def _require_host(parts: SplitResult, variable: str, forms: str) -> str:
    try:
        host = parts.hostname
    except ValueError:
        host = None
    if not host:
        raise EnvironmentVariableError(variable, f"has no host; expected {forms}")
    return unquote(host)


def _port(parts: SplitResult, variable: str, *, default: int) -> int:
    try:
        port = parts.port
    except ValueError:
        # Never quote the "port": in "postgres://user:secret/db" it is the password.
        raise EnvironmentVariableError(
            variable, "has a port that is not a number between 1 and 65535"
        ) from None
    if port is None:
        # urlsplit returns None both for "no port" and for an empty "host:" port.
        if parts.netloc.rpartition("@")[2].endswith(":"):
            raise EnvironmentVariableError(variable, "has an empty port after ':'")
        return default
    if not 1 <= port <= 65535:
        raise EnvironmentVariableError(variable, "has a port outside 1-65535")
    return port


def _host_for_display(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def database_display(database: Mapping[str, Any]) -> str:
    """Where a ``DATABASES`` entry points, without credentials: ``host:port/name``."""
    host = _host_for_display(str(database.get("HOST") or "localhost"))
    port = database.get("PORT") or POSTGRES_DEFAULT_PORT
    return f"{host}:{port}/{database['NAME']}"


# Settings derived from REDIS_URL.


def celery_settings(redis: RedisURL) -> dict[str, Any]:
    """``CELERY_*`` settings: Redis as the broker and the result backend."""
    return {
        "CELERY_TASK_SERIALIZER": "json",
        "CELERY_RESULT_SERIALIZER": "json",
        "CELERY_ACCEPT_CONTENT": ["json"],
        "CELERY_RESULT_EXPIRES": 3600,  # seconds
        "CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP": True,
        # A worker that lost Redis retries until it is back (every 2, 4, ... 30 s), however long
        # it is away: Celery's default gives up after 100 tries (about 47 minutes) and exits.
        "CELERY_BROKER_CONNECTION_MAX_RETRIES": None,
        "CELERY_BROKER_URL": redis.url,
        "CELERY_RESULT_BACKEND": redis.url,
    }


def channel_layers(redis: RedisURL) -> dict[str, Any]:
    """``CHANNEL_LAYERS``: channels_redis on Redis, shared by every process."""
    return {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [redis.url], "prefix": "asgi"},
        }
    }


def caches(redis: RedisURL) -> dict[str, Any]:
    """``CACHES``: Django's Redis cache."""
    return {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis.url,
            "KEY_PREFIX": "cache",
        }
    }
