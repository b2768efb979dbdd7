# Both targets do all set-up on a fresh machine: virtual environment, dependencies, PostgreSQL and
# Redis (the configured URLs, else the local default ports, else private instances under .run/,
# installing the Debian packages when missing), and migrations.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WITH_SERVICES = $(PY) -m devtools exec --

.PHONY: run test lint lock clean-run

$(VENV)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "authio needs Python 3.11 or newer; '$(PYTHON)' is $$($(PYTHON) --version 2>&1)." \
	         "Run with PYTHON=/path/to/python3.11" >&2; exit 1; }
	@$(PYTHON) -m venv --help >/dev/null 2>&1 && $(PYTHON) -c 'import ensurepip' 2>/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-dev; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $@

# Re-resolve the newest versions pyproject.toml allows and record them in constraints.txt.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install -q --upgrade pip && .lock-venv/bin/pip install -q -e '.[dev]'
	{ sed -n '1,2p' constraints.txt; .lock-venv/bin/pip freeze --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf .lock-venv

run: $(VENV)/.installed
	@mkdir -p .run && { [ -n "$$SERVICE_KMS_KEY$$SERVICE_KMS_KEY_FILE" ] || $(VENV)/bin/authio kms-key --file .run/kms.key >/dev/null; }
	@OTEL_EXPORTER=$${OTEL_EXPORTER:-none} SERVICE_KMS_KEY_FILE=$${SERVICE_KMS_KEY_FILE:-$$([ -n "$$SERVICE_KMS_KEY" ] || echo .run/kms.key)} \
	  $(WITH_SERVICES) sh -c '$(VENV)/bin/authio migrate && exec $(VENV)/bin/authio serve --generate-bootstrap-token'

test: $(VENV)/.installed
	@$(WITH_SERVICES) $(VENV)/bin/pytest -q $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy common engine control_plane devtools

clean-run:
	-$(PY) -m devtools stop
	rm -rf .run
