"""Settings from the environment: one parser, clear errors, no secrets in messages.

Every function here is pure (it reads the mapping it is given), so tests can feed it any
environment. ``config.settings`` calls :func:`load` once with ``os.environ``.

Variables:

- ``DATABASE_URL``: ``postgres://USER:PASSWORD@HOST:PORT/NAME`` (or ``postgresql://``), through
  psycopg 3; or ``sqlite:///relative/path`` / ``sqlite:////absolute/path``. Unset: SQLite file
  ``db.sqlite3`` in the repository.
- ``REDIS_URL``: ``redis://[:PASSWORD@]HOST[:PORT][/DB]`` or ``rediss://`` (TLS). Used for the
  Celery broker and result backend, the Channels layer and the Django cache. Unset: in-memory
  channel layer, eager Celery, local-memory cache.
- ``SECRET_KEY``: required when ``DEBUG`` is off.
- ``DEBUG``: ``1/0``, ``true/false``, ``yes/no``, ``on/off``. Unset: on (the local demo).
- ``ALLOWED_HOSTS``: comma-separated host names.
- ``SERVE_STATIC``: whether the ASGI app serves ``/static/`` itself. Unset: on.
- ``ENGINE_CONNECT_TIMEOUT_S``, ``ENGINE_READ_TIMEOUT_S``, ``ENGINE_ANSWER_TIMEOUT_S``: the
  engine client's waits (``scheduler_bridge.client``); ``LIVE_ACCESS_RECHECK_S``: how
  often an open websocket re-checks its user's access (``market.consumers``). Seconds > 0
  (:func:`env_seconds`); defaults in ``config.settings``.
- ``GATEWAY_API_KEY_CACHE_S``, ``GATEWAY_MARKET_CACHE_S`` (seconds >= 0, 0: no caching),
  ``GATEWAY_DB_THREADS``: the gateway's caches and database threads (``openai_api.gateway``);
  ``BATCH_QUEUE``, ``BATCH_CONCURRENCY``, ``BATCH_BUSY_RETRIES``, ``BATCH_MAX_LINES``,
  ``BATCH_MAX_BYTES``: batch jobs (``openai_api.batches``). Whole numbers through
  :func:`env_int`; defaults in ``config.settings``.
- ``ROUNDS_STREAM``, ``ENGINE_ADMIN_TOKEN`` (:func:`env_text`), ``AUTOBID_INTERVAL_S``,
  ``PRIORITY_SETTLE_GRACE_S``, ``STALE_REQUEST_S``: settlement, the console's push to engines and
  the periodic steps; defaults in ``config.settings``.
- ``METRICS_TOKEN``: the bearer token the gateway's ``/metrics`` asks for. Unset: ``/metrics``
  is off (403), so no deployment publishes its metrics by accident.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

POSTGRES_SCHEMES = ("postgres", "postgresql")
SQLITE_SCHEME = "sqlite"
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
DATABASE_URL_FORMS = "postgres://USER:PASSWORD@HOST:PORT/NAME or sqlite:///PATH"
REDIS_URL_FORMS = "redis://[:PASSWORD@]HOST[:PORT][/DB] or rediss://..."
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
DEV_SECRET_KEY = "django-insecure-dev-only-never-use-in-production"
DEBUG_ALLOWED_HOSTS = ("localhost", "127.0.0.1", "[::1]")


class EnvironmentVariableError(ImproperlyConfigured):
    """An environment variable is malformed. The message names it and never echoes a secret."""

    def __init__(self, variable: str, problem: str) -> None:
        self.variable = variable
        self.problem = problem
        super().__init__(f"{variable} {problem}")


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


@dataclass(frozen=True)
class EnvConfig:
    """Everything ``config.settings`` takes from the environment."""

    debug: bool
    secret_key: str
    allowed_hosts: list[str]
    database: dict[str, Any]
    redis: RedisURL | None
    serve_static: bool
    metrics_token: str | None


def load(environ: Mapping[str, str], *, base_dir: Path) -> EnvConfig:
    """Read and validate every variable; raise :class:`EnvironmentVariableError` on a bad one."""
    debug = env_bool(environ, "DEBUG", default=True)
    database_url = _get(environ, "DATABASE_URL")
    redis_url = _get(environ, "REDIS_URL")
    return EnvConfig(
        debug=debug,
        secret_key=secret_key(environ, debug=debug),
        allowed_hosts=env_list(
            environ, "ALLOWED_HOSTS", default=list(DEBUG_ALLOWED_HOSTS) if debug else []
        ),
        database=(
            parse_database_url(database_url, base_dir=base_dir)
            if database_url
            else sqlite_database(base_dir / "db.sqlite3")
        ),
        redis=parse_redis_url(redis_url) if redis_url else None,
        serve_static=env_bool(environ, "SERVE_STATIC", default=True),
        metrics_token=_get(environ, "METRICS_TOKEN"),
    )


def _get(environ: Mapping[str, str], name: str) -> str | None:
    """The stripped value, or None when unset or blank (blank counts as unset)."""
    value = environ.get(name, "").strip()
    return value or None


def env_bool(environ: Mapping[str, str], name: str, *, default: bool) -> bool:
    """Parse a boolean flag such as ``DEBUG``."""
    value = _get(environ, name)
    if value is None:
        return default
    word = value.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise EnvironmentVariableError(
        name, f"must be one of 1/0, true/false, yes/no, on/off; got {value!r}"
    )


def env_seconds(
    environ: Mapping[str, str], name: str, *, default: float, zero: bool = False
) -> float:
    """Parse a duration in seconds such as ``ENGINE_READ_TIMEOUT_S``: a finite number > 0, or
    >= 0 with ``zero`` (where 0 means "not at all", such as a cache that keeps nothing)."""
    value = _get(environ, name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (0 <= seconds if zero else 0 < seconds) or not seconds < math.inf:
        bound = ">= 0" if zero else "> 0"
        raise EnvironmentVariableError(name, f"must be a number of seconds {bound}; got {value!r}")
    return seconds


def env_int(environ: Mapping[str, str], name: str, *, default: int, low: int = 1) -> int:
    """Parse a whole number such as ``BATCH_CONCURRENCY``: an integer >= ``low``."""
    value = _get(environ, name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or number < low:
        raise EnvironmentVariableError(name, f"must be a whole number >= {low}; got {value!r}")
    return number


def env_text(environ: Mapping[str, str], name: str) -> str | None:
    """A plain string such as ``BATCH_QUEUE``, stripped; None when unset or blank."""
    return _get(environ, name)


def env_list(environ: Mapping[str, str], name: str, *, default: list[str]) -> list[str]:
    """Parse a comma-separated list; blank items are dropped."""
    value = _get(environ, name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def secret_key(environ: Mapping[str, str], *, debug: bool) -> str:
    """``SECRET_KEY``, with a development default that is only allowed when ``debug`` is on."""
    value = _get(environ, "SECRET_KEY")
    if value is not None:
        return value
    if debug:
        return DEV_SECRET_KEY
    raise EnvironmentVariableError(
        "SECRET_KEY", "must be set when DEBUG is off (a long random string)"
    )


def sqlite_database(path: Path | str) -> dict[str, Any]:
    """Django ``DATABASES`` entry for a SQLite file (or ``":memory:"``)."""
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}


# SQLite under concurrent writers (the embedded mode: the gateway's database thread, the
# round-record follower, the periodic tick and the pacing steps all write to one file). WAL lets
# reads go on beside the one writer; IMMEDIATE transactions take the write lock at BEGIN, since
# a deferred one that has read and then writes cannot wait for the lock (SQLite answers
# "database is locked" at once, to avoid a deadlock); and a connection waits up to
# SQLITE_TIMEOUT_S seconds for the lock before it gives up. synchronous=NORMAL is durable in
# WAL mode except for the last transactions before a power loss.
SQLITE_TIMEOUT_S = 10.0
SQLITE_CONCURRENT_OPTIONS: dict[str, Any] = {
    "transaction_mode": "IMMEDIATE",
    "timeout": SQLITE_TIMEOUT_S,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
}


def database_concurrent(database: Mapping[str, Any]) -> dict[str, Any]:
    """The ``DATABASES`` entry set up for several writers at once: a SQLite one gets
    :data:`SQLITE_CONCURRENT_OPTIONS` (its own options win), a PostgreSQL one is unchanged."""
    if not database["ENGINE"].endswith("sqlite3"):
        return dict(database)
    return {**database, "OPTIONS": {**SQLITE_CONCURRENT_OPTIONS, **database.get("OPTIONS", {})}}


def parse_database_url(value: str, *, base_dir: Path) -> dict[str, Any]:
    """Turn ``DATABASE_URL`` into a Django ``DATABASES["default"]`` entry.

    Relative SQLite paths are taken relative to ``base_dir`` (the repository), not the
    working directory, so every command sees the same file.
    """
    variable = "DATABASE_URL"
    parts = _split(value, variable, DATABASE_URL_FORMS)
    if parts.scheme == SQLITE_SCHEME:
        return _parse_sqlite(parts, base_dir=base_dir)
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


def _parse_sqlite(parts: SplitResult, *, base_dir: Path) -> dict[str, Any]:
    variable = "DATABASE_URL"
    if parts.netloc:
        raise EnvironmentVariableError(
            variable,
            "has a host in a sqlite URL; use sqlite:///relative/path or sqlite:////absolute/path",
        )
    if parts.query:
        raise EnvironmentVariableError(variable, "takes no query parameters in a sqlite URL")
    # "sqlite:///db.sqlite3" -> path "/db.sqlite3" -> relative; "sqlite:////tmp/x" -> absolute.
    path = unquote(parts.path[1:]) if parts.path.startswith("/") else unquote(parts.path)
    if not path:
        raise EnvironmentVariableError(
            variable, "has no file path; use sqlite:///relative/path or sqlite:////absolute/path"
        )
    if path == ":memory:":
        return sqlite_database(":memory:")
    file = Path(path)
    return sqlite_database(file if file.is_absolute() else base_dir / file)


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
    """Where a ``DATABASES`` entry points, without credentials: ``host:port/name`` or a path."""
    if database["ENGINE"].endswith("postgresql"):
        host = _host_for_display(str(database.get("HOST") or "localhost"))
        port = database.get("PORT") or POSTGRES_DEFAULT_PORT
        return f"{host}:{port}/{database['NAME']}"
    return str(database["NAME"])


# Settings derived from REDIS_URL (or its absence). Kept here so tests can check both branches.


def celery_settings(redis: RedisURL | None) -> dict[str, Any]:
    """``CELERY_*`` settings: Redis broker and result backend, or eager execution in-process."""
    common: dict[str, Any] = {
        "CELERY_TASK_SERIALIZER": "json",
        "CELERY_RESULT_SERIALIZER": "json",
        "CELERY_ACCEPT_CONTENT": ["json"],
        "CELERY_RESULT_EXPIRES": 3600,  # seconds
        "CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP": True,
    }
    if redis is None:
        return common | {
            "CELERY_BROKER_URL": "memory://",
            "CELERY_RESULT_BACKEND": None,
            "CELERY_TASK_ALWAYS_EAGER": True,
            "CELERY_TASK_EAGER_PROPAGATES": True,
        }
    return common | {
        "CELERY_BROKER_URL": redis.url,
        "CELERY_RESULT_BACKEND": redis.url,
        "CELERY_TASK_ALWAYS_EAGER": False,
        "CELERY_TASK_EAGER_PROPAGATES": False,
    }


def channel_layers(redis: RedisURL | None) -> dict[str, Any]:
    """``CHANNEL_LAYERS``: channels_redis on Redis, or the in-memory layer (one process only)."""
    if redis is None:
        return {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    return {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [redis.url], "prefix": "asgi"},
        }
    }


def caches(redis: RedisURL | None) -> dict[str, Any]:
    """``CACHES``: Django's Redis cache, or local memory."""
    if redis is None:
        return {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    return {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis.url,
            "KEY_PREFIX": "cache",
        }
    }
