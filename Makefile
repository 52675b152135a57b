# The two entry points from the README: `make up` (set up + run server and shim), `make test` (set up + all checks).
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: setup up test lint proto proto-check

$(STAMP): requirements.lock pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $(STAMP)

setup: $(STAMP)

up: $(STAMP)
	.venv/bin/sluice up

proto: $(STAMP)
	bash scripts/gen_protos.sh

proto-check: $(STAMP)
	bash scripts/check_protos.sh

lint: $(STAMP)
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

test: $(STAMP) proto-check lint
	$(PY) -m pytest
