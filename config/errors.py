"""The configuration's errors: what a malformed environment variable raises."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class EnvironmentVariableError(ImproperlyConfigured):
    """An environment variable is malformed. The message names it and never echoes a secret."""

    def __init__(self, variable: str, problem: str) -> None:
        self.variable = variable
        self.problem = problem
        super().__init__(f"{variable} {problem}")
