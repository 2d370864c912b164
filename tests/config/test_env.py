"""Parsing the environment: good URLs give the expected settings; bad ones a clear error."""

import string

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import given
from hypothesis import strategies as st

from config import backends, env
from config.env import EnvironmentVariableError

PASSWORD = "s3cretPassw0rd"


# --- DATABASE_URL: good -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            f"postgres://app:{PASSWORD}@db.internal:6543/market",
            {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": "market",
                "USER": "app",
                "PASSWORD": PASSWORD,
                "HOST": "db.internal",
                "PORT": "6543",
                "OPTIONS": {"connect_timeout": 5},
            },
        ),
        (
            "postgresql://postgres@127.0.0.1/market",
            {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": "market",
                "USER": "postgres",
                "PASSWORD": "",
                "HOST": "127.0.0.1",
                "PORT": "5432",
                "OPTIONS": {"connect_timeout": 5},
            },
        ),
        (
            # Percent-encoded user, password and name; IPv6 host; libpq options in the query.
            "POSTGRES://ops%40acme:p%40ss%2Fw@[::1]:5433/my%2Fdb?sslmode=require&connect_timeout=2",
            {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": "my/db",
                "USER": "ops@acme",
                "PASSWORD": "p@ss/w",
                "HOST": "::1",
                "PORT": "5433",
                "OPTIONS": {"connect_timeout": "2", "sslmode": "require"},
            },
        ),
    ],
)
def test_database_url_parses(url: str, expected: dict) -> None:
    assert backends.parse_database_url(url) == expected


# --- DATABASE_URL: malformed --------------------------------------------------------------

MALFORMED_DATABASE_URLS = [
    (f"mysql://app:{PASSWORD}@db/market", "has unsupported scheme 'mysql'"),
    ("localhost:5432", "is not a URL"),
    (f"postgres://app:{PASSWORD}@/market", "has no host"),
    (f"postgres://app:{PASSWORD}@db:abc/market", "has a port that is not a number"),
    (f"postgres://app:{PASSWORD}@db:99999/market", "has a port that is not a number"),
    (f"postgres://app:{PASSWORD}@db:0/market", "has a port outside 1-65535"),
    (f"postgres://app:{PASSWORD}@db:/market", "has an empty port"),
    (f"postgres://app:{PASSWORD}@db:5432", "has no database name"),
    (f"postgres://app:{PASSWORD}@db/", "has no database name"),
    (f"postgres://app:{PASSWORD}@db/a/b", "has a database name containing '/'"),
    (f"postgres://app:{PASSWORD}@db/market?foo=1", "has unsupported query parameter 'foo'"),
    (f"postgres://app:{PASSWORD}@[::1/market", "could not be parsed"),
    # "@host" forgotten: the password lands where the port should be, and must not be quoted.
    (f"postgres://app:{PASSWORD}/market", "has a port that is not a number"),
    ("sqlite:///db.sqlite3", "has unsupported scheme 'sqlite'"),
]


@pytest.mark.parametrize(("url", "problem"), MALFORMED_DATABASE_URLS)
def test_malformed_database_url_names_the_variable_and_the_problem(url: str, problem: str) -> None:
    with pytest.raises(EnvironmentVariableError) as raised:
        backends.parse_database_url(url)
    message = str(raised.value)
    assert isinstance(raised.value, ImproperlyConfigured)
    assert raised.value.variable == "DATABASE_URL"
    assert message.startswith("DATABASE_URL ")
    assert problem in message
    assert PASSWORD not in message
    assert PASSWORD not in repr(raised.value.args)


# --- REDIS_URL ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "host", "port", "db", "tls", "display"),
    [
        ("redis://127.0.0.1:6379/0", "127.0.0.1", 6379, 0, False, "127.0.0.1:6379/0"),
        (f"redis://:{PASSWORD}@cache:6380/2", "cache", 6380, 2, False, "cache:6380/2"),
        (
            "rediss://cache.example.com",
            "cache.example.com",
            6379,
            0,
            True,
            "cache.example.com:6379/0",
        ),
        ("redis://[::1]/", "::1", 6379, 0, False, "[::1]:6379/0"),
    ],
)
def test_redis_url_parses(url: str, host: str, port: int, db: int, tls: bool, display: str) -> None:
    parsed = backends.parse_redis_url(url)
    assert (parsed.url, parsed.host, parsed.port, parsed.db, parsed.tls) == (
        url,
        host,
        port,
        db,
        tls,
    )
    assert parsed.display == display
    assert PASSWORD not in parsed.display


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://cache:6379/0", "has unsupported scheme 'http'"),
        ("unix:///run/redis.sock", "has unsupported scheme 'unix'"),
        ("cache:6379", "is not a URL"),
        (f"redis://:{PASSWORD}@/0", "has no host"),
        (f"redis://:{PASSWORD}@cache:port/0", "has a port that is not a number"),
        (f"redis://:{PASSWORD}@cache/zero", "has a database number that is not"),
        (f"redis://:{PASSWORD}@cache/-1", "has a database number that is not"),
    ],
)
def test_malformed_redis_url_names_the_variable_and_the_problem(url: str, problem: str) -> None:
    with pytest.raises(EnvironmentVariableError) as raised:
        backends.parse_redis_url(url)
    message = str(raised.value)
    assert raised.value.variable == "REDIS_URL"
    assert message.startswith("REDIS_URL ")
    assert problem in message
    assert PASSWORD not in message


@given(
    password=st.text(alphabet=string.ascii_letters + string.digits + "!$&*+;=~", min_size=12),
    template=st.sampled_from(
        [
            "postgres://app:{pw}@db:notaport/market",
            "postgres://app:{pw}/market",
            "postgres://app:{pw}@/market",
            "postgres://app:{pw}@db",
            "mysql://app:{pw}@db/market",
            "redis://:{pw}@cache:port/0",
            "redis://:{pw}@cache/db",
            "redis://:{pw}@/0",
        ]
    ),
)
def test_no_error_echoes_the_password(password: str, template: str) -> None:
    url = template.format(pw=password)
    with pytest.raises(EnvironmentVariableError) as raised:
        if url.startswith("redis"):
            backends.parse_redis_url(url)
        else:
            backends.parse_database_url(url)
    assert password not in str(raised.value)


# --- flags, lists, secrets, the whole environment ------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("true", True), ("Yes", True), ("ON", True), ("0", False), ("off", False)],
)
def test_env_bool(value: str, expected: bool) -> None:
    assert env.env_bool({"DEBUG": value}, "DEBUG", default=not expected) is expected


def test_env_bool_rejects_other_words() -> None:
    with pytest.raises(EnvironmentVariableError, match=r"^DEBUG must be one of .*got 'maybe'"):
        env.env_bool({"DEBUG": "maybe"}, "DEBUG", default=False)


SERVICES = {"DATABASE_URL": "postgres://app@db/market", "REDIS_URL": "redis://cache:6379/0"}


def test_defaults_with_only_the_services_set() -> None:
    config = env.load(SERVICES)
    assert config.debug is True
    assert config.secret_key == env.DEV_SECRET_KEY
    assert config.allowed_hosts == ["localhost", "127.0.0.1", "[::1]"]
    assert config.database["ENGINE"] == "django.db.backends.postgresql"
    assert config.redis.host == "cache"
    assert config.serve_static is True


@pytest.mark.parametrize("variable", ["DATABASE_URL", "REDIS_URL"])
@pytest.mark.parametrize("value", [None, "  "])
def test_each_service_url_is_required_and_the_error_says_how_to_get_one(variable, value) -> None:
    environ = {k: v for k, v in SERVICES.items() if k != variable}
    if value is not None:
        environ[variable] = value
    with pytest.raises(EnvironmentVariableError) as raised:
        env.load(environ)
    assert raised.value.variable == variable
    message = str(raised.value)
    assert message.startswith(f"{variable} is not set.")
    assert "make run" in message and "python -m config.local_services -- COMMAND" in message


def test_production_needs_a_secret_key() -> None:
    with pytest.raises(
        EnvironmentVariableError, match=r"^SECRET_KEY must be set when DEBUG is off"
    ):
        env.load({**SERVICES, "DEBUG": "0"})


def test_production_environment() -> None:
    config = env.load(
        {
            "DEBUG": "false",
            "SECRET_KEY": "k" * 50,
            "ALLOWED_HOSTS": "market.example.com, .example.org,",
            "DATABASE_URL": "postgres://app:pw@db/market",
            "REDIS_URL": "redis://cache:6379/1",
            "SERVE_STATIC": "0",
        },
    )
    assert config.debug is False
    assert config.secret_key == "k" * 50
    assert config.allowed_hosts == ["market.example.com", ".example.org"]
    assert config.database["HOST"] == "db"
    assert config.redis is not None and config.redis.db == 1
    assert config.serve_static is False


def test_load_reports_a_malformed_url() -> None:
    with pytest.raises(EnvironmentVariableError, match=r"^REDIS_URL has no host"):
        env.load({**SERVICES, "REDIS_URL": "redis:///0"})


# --- what REDIS_URL switches ---------------------------------------------------------------

REDIS = backends.parse_redis_url("redis://cache:6379/0")


def test_with_redis_one_url_serves_broker_results_layer_and_cache() -> None:
    celery = backends.celery_settings(REDIS)
    assert "CELERY_TASK_ALWAYS_EAGER" not in celery
    assert celery["CELERY_BROKER_URL"] == celery["CELERY_RESULT_BACKEND"] == REDIS.url
    # A worker keeps trying to reach a Redis that went away, however long (issue 45).
    assert celery["CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP"] is True
    assert celery["CELERY_BROKER_CONNECTION_MAX_RETRIES"] is None
    layer = backends.channel_layers(REDIS)["default"]
    assert layer["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    assert layer["CONFIG"]["hosts"] == [REDIS.url]
    cache = backends.caches(REDIS)["default"]
    assert cache["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    assert cache["LOCATION"] == REDIS.url


def test_database_display_has_no_credentials() -> None:
    database = backends.parse_database_url(f"postgres://app:{PASSWORD}@db:5433/market")
    assert backends.database_display(database) == "db:5433/market"
