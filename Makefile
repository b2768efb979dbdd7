# Both targets do all set-up on a fresh machine: virtual environment, dependencies, PostgreSQL and
# Redis (the configured URLs, else the local default ports, else private instances under .run/,
# installing the Debian packages when missing), and migrations.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WITH_SERVICES = $(PY) -m common.devservices exec --

.PHONY: run test lint bench-data clean-run

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -m venv --help >/dev/null 2>&1 && $(PYTHON) -c 'import ensurepip' 2>/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-dev; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

run: $(VENV)/.installed
	@$(WITH_SERVICES) sh -c '$(VENV)/bin/authio migrate && exec $(VENV)/bin/authio serve --generate-bootstrap-token'

test: $(VENV)/.installed
	@$(WITH_SERVICES) $(VENV)/bin/pytest -q $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy common engine control_plane

clean-run:
	-$(PY) -m common.devservices stop
	rm -rf .run
