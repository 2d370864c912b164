#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import importlib
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from config.env import EnvironmentVariableError

    try:
        # Parse the environment before Django does, so a malformed variable is one clear line
        # (naming the variable) rather than a traceback.
        importlib.import_module(os.environ["DJANGO_SETTINGS_MODULE"])
    except EnvironmentVariableError as exc:
        sys.exit(f"Configuration error: {exc}")

    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
