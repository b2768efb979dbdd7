# Both targets do all set-up on a fresh machine: virtual environment, dependencies, PostgreSQL and
# Redis (the configured URLs, else the local default ports, else private instances under .run/,
# installing the Debian packages when missing), and migrations. Private instances keep running
# after run and test: `make stop` stops them, `make clean-run` deletes them with their data.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WITH_SERVICES = $(PY) -m devtools exec
# stop and clean-run also work without the virtual environment (devtools' stop needs no package).
DEVTOOLS = $(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m devtools

.PHONY: run run-split test lint openapi lock stop clean-run

# One line per step; a failed step stops with a message (devtools/bootstrap.sh).
$(VENV)/.installed: pyproject.toml constraints.txt clients/python/pyproject.toml
	@bash devtools/bootstrap.sh '$(PYTHON)' '$(VENV)'

# Re-resolve the newest versions pyproject.toml allows and record them in constraints.txt.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install -q --upgrade pip && .lock-venv/bin/pip install -q -e '.[dev]'
	{ sed -n '1,2p' constraints.txt; .lock-venv/bin/pip freeze --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf .lock-venv

# The local KMS key .run/kms.key unless SERVICE_KMS_KEY or SERVICE_KMS_KEY_FILE is set, and the
# environment that names it (run and run-split).
KMS_KEY = mkdir -p .run && { [ -n "$$SERVICE_KMS_KEY$$SERVICE_KMS_KEY_FILE" ] || [ -f .run/kms.key ] || $(VENV)/bin/authio kms-key --file .run/kms.key; }
RUN_ENV = OTEL_EXPORTER=$${OTEL_EXPORTER:-none} SERVICE_KMS_KEY_FILE=$${SERVICE_KMS_KEY_FILE:-$$([ -n "$$SERVICE_KMS_KEY" ] || echo .run/kms.key)}

run: $(VENV)/.installed
	@$(KMS_KEY)
	@$(RUN_ENV) $(WITH_SERVICES) --hint -- sh -c '$(VENV)/bin/authio migrate && exec $(VENV)/bin/authio serve --generate-bootstrap-token'

# The production topology on one machine (devtools/split.py): `authio serve engine --workers N`
# and `authio serve control-plane` as separate processes behind nginx (installed when missing)
# with deploy/'s routing, on PORT; the same PostgreSQL, Redis and migrations as run. Ctrl-C
# stops all of it. SPLIT_ARGS: more options (--workers N, --engine-port, --control-plane-port).
run-split: $(VENV)/.installed
	@$(KMS_KEY)
	@$(RUN_ENV) $(PY) -m devtools split --hint $(SPLIT_ARGS)

# After the tests, one line says where the private instances live, if any runs.
test: $(VENV)/.installed
	@$(WITH_SERVICES) -- $(VENV)/bin/pytest -q $(PYTEST_ARGS); status=$$?; $(PY) -m devtools hint; exit $$status

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy common engine control_plane devtools

# The OpenAPI document of every route, generated from the route tables (a test keeps it current).
openapi: $(VENV)/.installed
	$(VENV)/bin/authio openapi --out docs/openapi.json

# Stops the private PostgreSQL and Redis under .run/ (data kept; the next run starts them again).
stop:
	@$(DEVTOOLS) stop

# WARNING: deletes .run/: the private PostgreSQL and Redis with all their data, and the local KMS
# key .run/kms.key. Whatever a database that stays (the local server on 5432, DATABASE_URL) holds
# encrypted under that key, signing keys and queued messages, can no longer be decrypted.
clean-run:
	@echo "clean-run: deleting .run/ (the private PostgreSQL and Redis with their data, and the local KMS key .run/kms.key)"
	@$(DEVTOOLS) remove
	rm -rf .run
