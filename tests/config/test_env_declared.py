"""Every setting the code reads is declared in ``config.settings`` and read from the environment
through ``config.env``: the gateway's caches and threads and the batch jobs' limits, whose
variables used to do nothing (the code read them with ``getattr(settings, NAME, default)``)."""

from __future__ import annotations

import re

import pytest

from config import env
from tests.conftest import REPO_ROOT

# name: (default as printed, a value to set, that value as printed)
DECLARED = {
    "GATEWAY_API_KEY_CACHE_S": ("5.0", "0", "0.0"),
    "GATEWAY_MARKET_CACHE_S": ("2.0", "0.5", "0.5"),
    "GATEWAY_DB_THREADS": ("2", "6", "6"),
    "BATCH_QUEUE": ("None", " batches ", "batches"),
    "BATCH_CONCURRENCY": ("4", "1", "1"),
    "BATCH_BUSY_RETRIES": ("20", "0", "0"),
    "BATCH_MAX_LINES": ("10000", "25", "25"),
    "BATCH_MAX_BYTES": ("20971520", "4096", "4096"),
    # read by hand in config.settings before, through config.env now: the same values
    "ROUNDS_STREAM": ("inference-market:rounds", " im-x:rounds ", "im-x:rounds"),
    "AUTOBID_INTERVAL_S": ("10.0", "2.5", "2.5"),
    "AUTO_RESERVE_INTERVAL_S": ("10.0", "30", "30.0"),
    "ENGINE_ADMIN_TOKEN": ("None", " s3cret ", "s3cret"),
    "INVOICE_DUE_DAYS": ("30", "0", "0"),
    # twice ENGINE_ANSWER_TIMEOUT_S's 600 s unless set
    "STALE_REQUEST_S": ("1200.0", "900", "900.0"),
}
SHOW = "from django.conf import settings as s; print(" + ", ".join(f"s.{n}" for n in DECLARED) + ")"


def test_env_int() -> None:
    assert env.env_int({}, "BATCH_CONCURRENCY", default=4) == 4
    assert env.env_int({"BATCH_CONCURRENCY": " 8 "}, "BATCH_CONCURRENCY", default=4) == 8
    assert env.env_int({"BATCH_BUSY_RETRIES": "0"}, "BATCH_BUSY_RETRIES", default=20, low=0) == 0


@pytest.mark.parametrize("value", ["0", "-2", "2.5", "four", "1e3"])
def test_env_int_names_the_variable_of_a_bad_value(value: str) -> None:
    with pytest.raises(env.EnvironmentVariableError) as caught:
        env.env_int({"BATCH_CONCURRENCY": value}, "BATCH_CONCURRENCY", default=4)
    assert caught.value.variable == "BATCH_CONCURRENCY"
    assert "whole number >= 1" in caught.value.problem


def test_env_seconds_may_allow_zero() -> None:
    name = "GATEWAY_MARKET_CACHE_S"
    assert env.env_seconds({name: "0"}, name, default=2.0, zero=True) == 0.0
    for bad in ("-1", "inf", "nan", "soon"):
        with pytest.raises(env.EnvironmentVariableError, match="seconds >= 0"):
            env.env_seconds({name: bad}, name, default=2.0, zero=True)
    with pytest.raises(env.EnvironmentVariableError, match="seconds > 0"):
        env.env_seconds({name: "0"}, name, default=2.0)


def test_env_list_may_split_on_another_separator() -> None:
    name = "INVOICE_ISSUER_ADDRESS"
    given = {name: " 1 Main St, Suite 2 ;; Springfield, IL 62701 ; "}
    assert env.env_list(given, name, default=[], sep=";") == [
        "1 Main St, Suite 2",
        "Springfield, IL 62701",
    ]
    assert env.env_list({}, name, default=["x"], sep=";") == ["x"]


def test_env_text() -> None:
    assert env.env_text({"BATCH_QUEUE": "  "}, "BATCH_QUEUE") is None
    assert env.env_text({"BATCH_QUEUE": " q "}, "BATCH_QUEUE") == "q"


def test_settings_take_them_from_the_environment(run_manage) -> None:
    unset = {name: "" for name in DECLARED}
    defaults = run_manage("shell", "--no-imports", "-c", SHOW, env=unset)
    assert defaults.returncode == 0, defaults.stderr
    assert defaults.stdout.split() == [d for d, _, _ in DECLARED.values()]
    given = run_manage(
        "shell", "--no-imports", "-c", SHOW, env={n: v for n, (_, v, _) in DECLARED.items()}
    )
    assert given.returncode == 0, given.stderr
    assert given.stdout.split() == [p for _, _, p in DECLARED.values()]
    bad = run_manage("shell", "--no-imports", "-c", SHOW, env={"GATEWAY_DB_THREADS": "0"})
    assert bad.returncode != 0 and "GATEWAY_DB_THREADS must be a whole number" in bad.stderr
    bad = run_manage("shell", "--no-imports", "-c", SHOW, env={"AUTOBID_INTERVAL_S": "0"})
    assert bad.returncode != 0
    assert "AUTOBID_INTERVAL_S must be a number of seconds > 0" in bad.stderr
    # The sweep must not fail a request the gateway still waits for: 600 s is not enough...
    bad = run_manage("shell", "--no-imports", "-c", SHOW, env={"STALE_REQUEST_S": "600"})
    assert bad.returncode != 0
    assert "STALE_REQUEST_S must exceed ENGINE_ANSWER_TIMEOUT_S (600 s)" in bad.stderr
    # ... unless the gateway waits less; and the default follows the gateway's wait.
    shorter = {"STALE_REQUEST_S": "600", "ENGINE_ANSWER_TIMEOUT_S": "120"}
    assert run_manage("shell", "--no-imports", "-c", SHOW, env=shorter).returncode == 0
    shown = "from django.conf import settings as s; print(s.STALE_REQUEST_S)"
    default = run_manage(
        "shell", "--no-imports", "-c", shown, env={"ENGINE_ANSWER_TIMEOUT_S": "90"}
    )
    assert default.stdout.split() == ["180.0"], default.stderr


def test_no_setting_is_read_with_a_default_of_its_own() -> None:
    """``getattr(settings, NAME, default)`` hides an undeclared setting; read ``settings.NAME``."""
    pattern = re.compile(r"getattr\(\s*settings\s*,")
    offenders = [
        str(path.relative_to(REPO_ROOT))
        for package in ("accounts", "config", "market", "scheduler_bridge")
        for path in sorted((REPO_ROOT / package).rglob("*.py"))
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
