"""Durations from the environment (``env_seconds``): the engine client's timeouts and the live
sockets' re-check interval, read by ``config.settings``."""

from __future__ import annotations

import pytest

from config import env


@pytest.mark.parametrize(("value", "expected"), [("3", 3.0), (" 0.25 ", 0.25), ("1e2", 100.0)])
def test_env_seconds_parses_a_positive_number(value: str, expected: float) -> None:
    assert env.env_seconds(
        {"ENGINE_READ_TIMEOUT_S": value}, "ENGINE_READ_TIMEOUT_S", default=30
    ) == (expected)


@pytest.mark.parametrize("environ", [{}, {"ENGINE_READ_TIMEOUT_S": "  "}])
def test_env_seconds_unset_or_blank_is_the_default(environ: dict) -> None:
    assert env.env_seconds(environ, "ENGINE_READ_TIMEOUT_S", default=30.0) == 30.0


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "thirty", "3s"])
def test_env_seconds_names_the_variable_of_a_bad_value(value: str) -> None:
    with pytest.raises(env.EnvironmentVariableError) as caught:
        env.env_seconds({"ENGINE_CONNECT_TIMEOUT_S": value}, "ENGINE_CONNECT_TIMEOUT_S", default=3)
    assert caught.value.variable == "ENGINE_CONNECT_TIMEOUT_S"
    assert "seconds > 0" in caught.value.problem


def test_settings_take_the_timeouts_from_the_environment(run_manage) -> None:
    names = (
        "ENGINE_CONNECT_TIMEOUT_S",
        "ENGINE_READ_TIMEOUT_S",
        "ENGINE_ANSWER_TIMEOUT_S",
        "LIVE_ACCESS_RECHECK_S",
    )
    show = (
        "from django.conf import settings as s; print(" + ", ".join(f"s.{n}" for n in names) + ")"
    )
    defaults = run_manage("shell", "--no-imports", "-c", show)
    assert defaults.returncode == 0, defaults.stderr
    assert defaults.stdout.split() == ["3.0", "30.0", "600.0", "5.0"]
    given = run_manage(
        "shell", "--no-imports", "-c", show, env=dict(zip(names, ("1", "2", "3", "4"), strict=True))
    )
    assert given.returncode == 0, given.stderr
    assert given.stdout.split() == ["1.0", "2.0", "3.0", "4.0"]
    bad = run_manage("shell", "--no-imports", "-c", show, env={"ENGINE_READ_TIMEOUT_S": "0"})
    assert bad.returncode != 0 and "ENGINE_READ_TIMEOUT_S must be a number" in bad.stderr
