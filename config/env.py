"""Settings from the environment: one parser, clear errors, no secrets in messages.

Every function here is pure (it reads the mapping it is given), so tests can feed it any
environment. ``config.settings`` calls :func:`load` once with ``os.environ``. What the service
URLs turn into (``DATABASES``, Celery, Channels and the cache) is ``config.backends``.

Variables:

- ``DATABASE_URL``: ``postgres://USER:PASSWORD@HOST:PORT/NAME`` (or ``postgresql://``), through
  psycopg 3. Required: ``make run`` and ``make test`` set it to the checkout's own PostgreSQL
  when it is unset (``config.local_services``).
- ``REDIS_URL``: ``redis://[:PASSWORD@]HOST[:PORT][/DB]`` or ``rediss://`` (TLS). Used for the
  Celery broker and result backend, the Channels layer, the Django cache, the round records and
  the control store. Required, and set like ``DATABASE_URL``.
- ``SECRET_KEY``: required when ``DEBUG`` is off.
- ``DEBUG``: ``1/0``, ``true/false``, ``yes/no``, ``on/off``. Unset: on (the local demo).
- ``ALLOWED_HOSTS``: comma-separated host names.
- ``SERVE_STATIC``: whether the ASGI app serves ``/static/`` itself. Unset: on.
- ``ENGINE_CONNECT_TIMEOUT_S``, ``ENGINE_READ_TIMEOUT_S``, ``ENGINE_ANSWER_TIMEOUT_S``: the
  engine client's waits (``engines.client``); ``LIVE_ACCESS_RECHECK_S``: how
  often an open websocket re-checks its user's access (``market.consumers``). Seconds > 0
  (:func:`env_seconds`); defaults in ``config.settings``.
- ``GATEWAY_API_KEY_CACHE_S``, ``GATEWAY_MARKET_CACHE_S`` (seconds >= 0, 0: no caching),
  ``GATEWAY_DB_THREADS``, ``GATEWAY_LEDGER_BATCH_S`` (seconds >= 0),
  ``GATEWAY_LEDGER_BATCH_SIZE``: the gateway's caches, database threads and ledger batches
  (``openai_api.gateway``);
  ``BATCH_QUEUE``, ``BATCH_CONCURRENCY``, ``BATCH_BUSY_RETRIES``, ``BATCH_MAX_LINES``,
  ``BATCH_MAX_BYTES``: batch jobs (``openai_api.batches``). Whole numbers through
  :func:`env_int`; defaults in ``config.settings``.
- ``ROUNDS_STREAM``, ``ENGINE_ADMIN_TOKEN`` (:func:`env_text`), ``AUTOBID_INTERVAL_S``,
  ``AUTO_RESERVE_INTERVAL_S``, ``STALE_REQUEST_S``: settlement, the console's push to engines
  and the periodic steps; defaults in ``config.settings``.
- ``METRICS_TOKEN``: the bearer token the gateway's ``/metrics`` asks for. Unset: ``/metrics``
  is off (403), so no deployment publishes its metrics by accident.
- ``INVOICE_ISSUER_NAME`` (:func:`env_text`), ``INVOICE_ISSUER_ADDRESS`` (lines separated by
  ``;``, :func:`env_list`), ``INVOICE_DUE_DAYS`` (:func:`env_int`, >= 0): who issues the
  invoices and how many days after its issue an invoice is due (``accounts.exports``);
  demo defaults in ``config.settings``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from config.backends import RedisURL, parse_database_url, parse_redis_url
from config.errors import EnvironmentVariableError

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
DEV_SECRET_KEY = "django-insecure-dev-only-never-use-in-production"
DEBUG_ALLOWED_HOSTS = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True)
class EnvConfig:
    """Everything ``config.settings`` takes from the environment."""

    debug: bool
    secret_key: str
    allowed_hosts: list[str]
    database: dict[str, Any]
    redis: RedisURL
    serve_static: bool
    metrics_token: str | None


def load(environ: Mapping[str, str]) -> EnvConfig:
    """Read and validate every variable; raise :class:`EnvironmentVariableError` on a bad one."""
    debug = env_bool(environ, "DEBUG", default=True)
    return EnvConfig(
        debug=debug,
        secret_key=secret_key(environ, debug=debug),
        allowed_hosts=env_list(
            environ, "ALLOWED_HOSTS", default=list(DEBUG_ALLOWED_HOSTS) if debug else []
        ),
        database=parse_database_url(service_url(environ, "DATABASE_URL")),
        redis=parse_redis_url(service_url(environ, "REDIS_URL")),
        serve_static=env_bool(environ, "SERVE_STATIC", default=True),
        metrics_token=env_text(environ, "METRICS_TOKEN"),
    )


def service_url(environ: Mapping[str, str], name: str) -> str:
    """``DATABASE_URL`` or ``REDIS_URL``, which every command needs."""
    value = env_text(environ, name)
    if value is None:
        raise EnvironmentVariableError(
            name,
            "is not set. `make run` and `make test` start the checkout's own PostgreSQL and "
            "Redis when it is unset; for another command, run it through them with "
            "`python -m config.local_services -- COMMAND`, or set it to your own service",
        )
    return value


def env_text(environ: Mapping[str, str], name: str) -> str | None:
    """A plain string such as ``BATCH_QUEUE``, stripped; None when unset or blank."""
    return environ.get(name, "").strip() or None


def env_bool(environ: Mapping[str, str], name: str, *, default: bool) -> bool:
    """Parse a boolean flag such as ``DEBUG``."""
    value = env_text(environ, name)
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
    value = env_text(environ, name)
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
    value = env_text(environ, name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or number < low:
        raise EnvironmentVariableError(name, f"must be a whole number >= {low}; got {value!r}")
    return number


def env_list(
    environ: Mapping[str, str], name: str, *, default: list[str], sep: str = ","
) -> list[str]:
    """Parse a list separated by ``sep`` (a comma unless said otherwise); blank items are
    dropped."""
    value = env_text(environ, name)
    if value is None:
        return default
    return [item.strip() for item in value.split(sep) if item.strip()]


def secret_key(environ: Mapping[str, str], *, debug: bool) -> str:
    """``SECRET_KEY``, with a development default that is only allowed when ``debug`` is on."""
    value = env_text(environ, "SECRET_KEY")
    if value is not None:
        return value
    if debug:
        return DEV_SECRET_KEY
    raise EnvironmentVariableError(
        "SECRET_KEY", "must be set when DEBUG is off (a long random string)"
    )
