# The README's two commands: `make run` and `make test`. Both create or reuse .venv.

PYTHON_BOOT := $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# Holds the sha256 of the pyproject.toml the venv was installed from.
STAMP := $(VENV)/.installed-pyproject
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-k healthz -x"`.
PYTEST_ARGS ?=
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test venv lint format

## venv: create .venv if missing; (re)install the project when pyproject.toml changed
venv:
	@if [ ! -x "$(PY)" ]; then \
		[ -n "$(PYTHON_BOOT)" ] || { echo "Neither python3.11 nor python3 is on PATH." >&2; exit 1; }; \
		echo "Creating $(VENV) with $(PYTHON_BOOT)"; \
		"$(PYTHON_BOOT)" -m venv "$(VENV)"; \
	fi
	@want=$$(sha256sum pyproject.toml | cut -d' ' -f1); \
	if [ "$$(cat "$(STAMP)" 2>/dev/null)" != "$$want" ]; then \
		echo "Installing the project into $(VENV) (pyproject.toml changed)"; \
		"$(PY)" -m pip install --quiet -e '.[dev]' && echo "$$want" > "$(STAMP)"; \
	fi

## run: check services, migrate, seed the demo accounts, serve on http://$(HOST):$(PORT)/
run: venv
	@"$(PY)" manage.py check_services
	@"$(PY)" manage.py migrate --noinput
	@"$(PY)" manage.py seed_demo
	@echo "Serving on http://$(HOST):$(PORT)/  (health: http://$(HOST):$(PORT)/healthz; Ctrl-C stops)"
	@exec "$(VENV)/bin/daphne" -b "$(HOST)" -p "$(PORT)" config.asgi:application

## test: the whole test suite
test: venv
	@"$(VENV)/bin/pytest" $(PYTEST_ARGS)

lint: venv
	@"$(VENV)/bin/ruff" check .
	@"$(VENV)/bin/ruff" format --check .

format: venv
	@"$(VENV)/bin/ruff" check --fix .
	@"$(VENV)/bin/ruff" format .
