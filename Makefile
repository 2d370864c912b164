# The README's two commands: `make run` and `make test`. Both create or reuse .venv.

PYTHON_BOOT := $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# What needs PostgreSQL and Redis runs through this: with DATABASE_URL / REDIS_URL unset it starts
# the checkout's own (data in var/services/) for the command and stops them after it.
WITH_SERVICES := "$(PY)" -m config.local_services --
# Holds the sha256 of the pyproject.toml the venv was installed from.
STAMP := $(VENV)/.installed-pyproject
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-k healthz -x"` (the main stage) or
# `make test-sglang SGLANG_PYTEST_ARGS="-k adder"` (the SGLang plugin's stage).
PYTEST_ARGS ?=
SGLANG_PYTEST_ARGS ?=
# `make run`'s ports: the web server on PORT; the market's entry point (smg, or the one engine
# with REPLICAS=1) on ENGINE_PORT and its REPLICAS replicas on the ports after it. A second
# `make run` on one machine needs other values, e.g. `make run PORT=8100 ENGINE_PORT=31000`.
HOST ?= 127.0.0.1
PORT ?= 8000
ENGINE_PORT ?= 30000
REPLICAS ?= 2
# Extra `manage.py live_market` options for `make run`, e.g.
# `make run RUN_ARGS="--router-policy cache_aware --load 0.7"` (`manage.py live_market --help`).
RUN_ARGS ?=
LIVE_MARKET := manage.py live_market --host "$(HOST)" --port "$(PORT)" \
	--engine-port "$(ENGINE_PORT)" --replicas "$(REPLICAS)" $(RUN_ARGS)
# The SGLang plugin's CPU test stage has a venv of its own: SGLang 0.5.23 (installed without its
# GPU dependencies), torch and the project.
SGLANG_VENV := .venv-sglang
SGLANG_PY := $(SGLANG_VENV)/bin/python
SGLANG_REQUIREMENTS := engines/sglang_plugin/requirements-cpu.txt
# Holds the sha256 of pyproject.toml and the requirements the venv was installed from.
SGLANG_STAMP := $(SGLANG_VENV)/.installed-inputs

.PHONY: run test test-main test-sglang venv venv-sglang lint imports types format

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

## run: with PostgreSQL and Redis (the checkout's own unless configured), check its ports and
## the services, migrate, seed the demo, then run the live market on http://$(HOST):$(PORT)/
## (the simulated engines, the web server, settlement and publishers, and agents bidding)
run: venv
	@exec $(WITH_SERVICES) sh -c '"$(PY)" $(LIVE_MARKET) --check-ports \
		&& "$(PY)" manage.py check_services && "$(PY)" manage.py migrate --noinput \
		&& "$(PY)" manage.py seed_demo && exec "$(PY)" $(LIVE_MARKET)'

## test: the whole test suite, in two stages: the main suite, then the SGLang plugin's
test: test-main test-sglang

## test-main: everything but the SGLang plugin's tests, in .venv
test-main: venv
	@exec $(WITH_SERVICES) "$(VENV)/bin/pytest" --ignore=tests/engines/sglang_plugin $(PYTEST_ARGS)

## venv-sglang: create .venv-sglang if missing; (re)install when its inputs changed. The first
## install copies torch (several GB) from pip's sources and takes minutes.
venv-sglang:
	@if [ ! -x "$(SGLANG_PY)" ]; then \
		[ -n "$(PYTHON_BOOT)" ] || { echo "Neither python3.11 nor python3 is on PATH." >&2; exit 1; }; \
		echo "Creating $(SGLANG_VENV) with $(PYTHON_BOOT)"; \
		"$(PYTHON_BOOT)" -m venv "$(SGLANG_VENV)"; \
	fi
	@want=$$(cat pyproject.toml "$(SGLANG_REQUIREMENTS)" | sha256sum | cut -d' ' -f1); \
	if [ "$$(cat "$(SGLANG_STAMP)" 2>/dev/null)" != "$$want" ]; then \
		echo "Installing SGLang 0.5.23 (CPU, no GPU kernels) and the project into $(SGLANG_VENV)"; \
		"$(SGLANG_PY)" -m pip install --quiet -e '.[dev]' -r "$(SGLANG_REQUIREMENTS)" \
		&& "$(SGLANG_PY)" -m pip install --quiet --no-deps sglang==0.5.23 \
		&& echo "$$want" > "$(SGLANG_STAMP)"; \
	fi

## test-sglang: the SGLang plugin against SGLang's real scheduler classes, on the CPU
test-sglang: venv-sglang
	@echo "==> SGLang plugin stage ($(SGLANG_VENV))"
	@exec $(WITH_SERVICES) "$(SGLANG_VENV)/bin/pytest" tests/engines/sglang_plugin $(SGLANG_PYTEST_ARGS)

lint: venv imports
	@"$(VENV)/bin/ruff" check .
	@"$(VENV)/bin/ruff" format --check .

## types: mypy, strict on the packages [tool.mypy] lists in pyproject.toml
types: venv
	@"$(VENV)/bin/mypy"

## imports: the one-way import graph (contracts in .importlinter; README, "Layout")
imports: venv
	@"$(VENV)/bin/lint-imports"

format: venv
	@"$(VENV)/bin/ruff" check --fix .
	@"$(VENV)/bin/ruff" format .
