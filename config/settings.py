"""Django settings. Everything that varies between machines comes from the environment.

See ``config/env.py`` for the variables and their defaults. ``DATABASE_URL`` (PostgreSQL) and
``REDIS_URL`` are required; ``make run`` and ``make test`` start the checkout's own when they are
unset (``config.local_services``).
"""

import os
from pathlib import Path

from celery.schedules import crontab

from config import backends, env
from engines.contract.records import DEFAULT_STREAM

BASE_DIR = Path(__file__).resolve().parent.parent

ENV = env.load(os.environ)

DEBUG = ENV.debug
SECRET_KEY = ENV.secret_key
ALLOWED_HOSTS = ENV.allowed_hosts

INSTALLED_APPS = [
    # daphne first: its runserver replaces Django's, so `manage.py runserver` serves ASGI.
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Redoc's bundle as a static file, for the API reference page (/docs/api/): no CDN.
    "drf_spectacular_sidecar",
    # The project package is an app too: it holds project-wide commands (check_services).
    "config",
    "accounts",
    "market",
    "scheduler_bridge",
    "openai_api",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "config.context_processors.nav",
            ],
        },
    },
]

# The database: PostgreSQL through psycopg 3, from DATABASE_URL.
DATABASES = {"default": ENV.database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis: one URL for the Celery broker and results, the Channels layer and the cache.
REDIS_URL = ENV.redis.url
CACHES = backends.caches(ENV.redis)
CHANNEL_LAYERS = backends.channel_layers(ENV.redis)
# CELERY_BROKER_URL, CELERY_RESULT_BACKEND, ...
globals().update(backends.celery_settings(ENV.redis))
# Tasks that acknowledge late take one message at a time, so a lost worker strands only that one.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1

# Periodic work, run by `celery -A config beat` (and a worker: `celery -A config worker`).
# Round records: the Redis stream the engines write (scheduler_bridge.settlement.stream).
ROUNDS_STREAM = env.env_text(os.environ, "ROUNDS_STREAM") or DEFAULT_STREAM
# Seconds between two pacing steps of each autobidder (accounts.services.autobidder).
AUTOBID_INTERVAL_S = env.env_seconds(os.environ, "AUTOBID_INTERVAL_S", default=10.0)
# Seconds between two steps of the markets' automatic reserves (market.reserves): each step
# measures the priority wait of the requests finished in the last interval.
AUTO_RESERVE_INTERVAL_S = env.env_seconds(os.environ, "AUTO_RESERVE_INTERVAL_S", default=10.0)
# Sent as `Authorization: Bearer ...` to engines' /admin/market (market.engine_control).
ENGINE_ADMIN_TOKEN = env.env_text(os.environ, "ENGINE_ADMIN_TOKEN")
# The engine client's waits, seconds (engines.client explains them): connecting;
# silence (mid-answer: a failure; before the answer begins: then the engine's health is checked);
# and the longest an answer may take to begin (a non-streamed one: the whole answer).
ENGINE_CONNECT_TIMEOUT_S = env.env_seconds(os.environ, "ENGINE_CONNECT_TIMEOUT_S", default=3.0)
ENGINE_READ_TIMEOUT_S = env.env_seconds(os.environ, "ENGINE_READ_TIMEOUT_S", default=30.0)
ENGINE_ANSWER_TIMEOUT_S = env.env_seconds(os.environ, "ENGINE_ANSWER_TIMEOUT_S", default=600.0)
# How long a request's hold may stay open, seconds: a request still queued this long after it
# was opened fails, uncharged, its hold released (accounts.services.settlement.holds_sweep): the
# last resort. A gateway releases a hold itself when the client leaves, the engine fails or its
# stop cuts the request off; those of a killed gateway process are released once its heartbeat
# is gone (accounts.services.gateways: 10-15 s). It must exceed
# ENGINE_ANSWER_TIMEOUT_S, the longest the gateway waits for an answer to begin, or a request
# still served would be failed and go uncharged: twice that by default (20 minutes).
STALE_REQUEST_S = env.env_seconds(
    os.environ, "STALE_REQUEST_S", default=2 * ENGINE_ANSWER_TIMEOUT_S
)
if STALE_REQUEST_S <= ENGINE_ANSWER_TIMEOUT_S:
    raise env.EnvironmentVariableError(
        "STALE_REQUEST_S",
        f"must exceed ENGINE_ANSWER_TIMEOUT_S ({ENGINE_ANSWER_TIMEOUT_S:g} s), the longest the"
        f" gateway waits for an answer to begin, or requests still being served would be failed"
        f" and go uncharged; got {STALE_REQUEST_S:g}",
    )
# Seconds between two re-checks of an open websocket's access (market.consumers); changes to a
# membership or a user, and logouts, close the sockets concerned at once anyway.
LIVE_ACCESS_RECHECK_S = env.env_seconds(os.environ, "LIVE_ACCESS_RECHECK_S", default=5.0)
# The gateway's /metrics needs `Authorization: Bearer <METRICS_TOKEN>`; off (403) while unset.
METRICS_TOKEN = ENV.metrics_token
# The gateway's caches in each process, seconds (0: nothing cached): an API key (a revoked key
# works at most this long; openai_api.gateway.keys) and a market (a reserve or price change
# reaches the gateway within this time; openai_api.gateway.selectors).
GATEWAY_API_KEY_CACHE_S = env.env_seconds(
    os.environ, "GATEWAY_API_KEY_CACHE_S", default=5.0, zero=True
)
GATEWAY_MARKET_CACHE_S = env.env_seconds(
    os.environ, "GATEWAY_MARKET_CACHE_S", default=2.0, zero=True
)
# The gateway's database threads (openai_api.gateway.db). Its work is
# Python under the GIL: more threads mostly contend.
GATEWAY_DB_THREADS = env.env_int(os.environ, "GATEWAY_DB_THREADS", default=2)
# The gateway's ledger batches (openai_api.gateway.batching): each process writes the holds
# (and apart, the settlements) that arrive within this many seconds of a batch's first, when
# they come that fast, or this many, as one statement.
GATEWAY_LEDGER_BATCH_S = env.env_seconds(
    os.environ, "GATEWAY_LEDGER_BATCH_S", default=0.02, zero=True
)
GATEWAY_LEDGER_BATCH_SIZE = env.env_int(os.environ, "GATEWAY_LEDGER_BATCH_SIZE", default=64)
# Batch jobs (openai_api.batches): the Celery queue of their runs (unset: the default
# queue), requests of one batch in flight at a time, how often a line waits out a full engine
# queue (429) before it fails, and the most lines and bytes one batch's input may have.
BATCH_QUEUE = env.env_text(os.environ, "BATCH_QUEUE")
BATCH_CONCURRENCY = env.env_int(os.environ, "BATCH_CONCURRENCY", default=4)
BATCH_BUSY_RETRIES = env.env_int(os.environ, "BATCH_BUSY_RETRIES", default=20, low=0)
BATCH_MAX_LINES = env.env_int(os.environ, "BATCH_MAX_LINES", default=10_000)
BATCH_MAX_BYTES = env.env_int(os.environ, "BATCH_MAX_BYTES", default=20 * 1024 * 1024)
# Who issues the invoices (their PDF's letterhead; accounts.exports): a name and address lines
# (separated by ";" in the variable), and the days after its issue date an invoice is due. The
# defaults are the demo's, plainly not a real company.
INVOICE_ISSUER_NAME = env.env_text(os.environ, "INVOICE_ISSUER_NAME") or "Inference Market (demo)"
INVOICE_ISSUER_ADDRESS = env.env_list(
    os.environ,
    "INVOICE_ISSUER_ADDRESS",
    default=["1 Example Street", "Example City, EX 00000", "Demo Land"],
    sep=";",
)
INVOICE_DUE_DAYS = env.env_int(os.environ, "INVOICE_DUE_DAYS", default=30, low=0)


def _every(task: str, seconds: float, *, expires: float | None = None) -> dict[str, object]:
    """A beat entry: ``task`` every ``seconds``. Its ticks expire after ``expires`` seconds (the
    period unless said) rather than pile up while no worker runs; their results are not kept."""
    options = {"expires": expires or seconds, "ignore_result": True}
    return {"task": task, "schedule": seconds, "options": options}


CELERY_BEAT_SCHEDULE = {
    "rounds-consume": _every("scheduler_bridge.rounds_consume", 1.0, expires=5.0),
    # Engine status and token-charge spend ticks for the live consoles (market.live.periodic).
    "live-publish": _every("market.live_publish", 1.0, expires=2.0),
    "autobidders-step": _every("accounts.autobidders_step", AUTOBID_INTERVAL_S),
    "hold-horizons": _every("market.hold_horizons_renew", AUTOBID_INTERVAL_S),
    "auto-reserves": _every("market.reserves_auto_step", AUTO_RESERVE_INTERVAL_S),
    "wait-bounds": _every("market.wait_bounds_renew", AUTO_RESERVE_INTERVAL_S),
    # The requests of a gateway process that stopped beating (accounts.services.gateways).
    "gateways-sweep": _every("accounts.gateways_sweep", 5.0),
    "holds-sweep": _every("accounts.holds_sweep", 60.0),
    "invoices-generate": {
        "task": "accounts.invoices_generate",
        "schedule": crontab(hour=0, minute=30),  # daily, 00:30 UTC
        "options": {"expires": 3600.0},
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "home"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
# When on, config.asgi serves /static/ from the app and STATICFILES_DIRS (no collectstatic
# needed). Behind a reverse proxy, set SERVE_STATIC=0 and serve STATIC_ROOT there.
SERVE_STATIC = ENV.serve_static

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # A 4xx refusal (a 403 for a page someone may not see) in one line, not with a traceback.
    "filters": {"client_error_one_line": {"()": "config.logs.ClientErrorOneLine"}},
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django.request": {"filters": ["client_error_one_line"]}},
    "root": {"handlers": ["console"], "level": "INFO" if DEBUG else "WARNING"},
}
