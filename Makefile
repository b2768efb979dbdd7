# Both targets do all set-up on a fresh machine: virtual environment, dependencies, PostgreSQL and
# Redis (the configured URLs, else the local default ports, else private instances under .run/,
# installing the Debian packages when missing), and migrations.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WITH_SERVICES = $(PY) -m devtools exec --

.PHONY: run test lint lock clean-run

# One line per step; a failed step stops with a message (devtools/bootstrap.sh).
$(VENV)/.installed: pyproject.toml constraints.txt
	@bash devtools/bootstrap.sh '$(PYTHON)' '$(VENV)'

# Re-resolve the newest versions pyproject.toml allows and record them in constraints.txt.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install -q --upgrade pip && .lock-venv/bin/pip install -q -e '.[dev]'
	{ sed -n '1,2p' constraints.txt; .lock-venv/bin/pip freeze --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf .lock-venv

run: $(VENV)/.installed
	@mkdir -p .run && { [ -n "$$SERVICE_KMS_KEY$$SERVICE_KMS_KEY_FILE" ] || [ -f .run/kms.key ] || $(VENV)/bin/authio kms-key --file .run/kms.key; }
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
