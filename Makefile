# The two entry points from the README: `make up` (set up + run server and shim), `make test` (set up + all checks).
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: setup test-tools up test test-parallel lint proto proto-check cuda-wheels bench-llamacpp

# A recipe that fails leaves no stamp behind (the touch is its last step), so the next make retries it.
$(STAMP): requirements.lock requirements-nodeps.lock pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $(STAMP)

setup: $(STAMP)

# What the suites drive besides Python (h2load, Chromium, promtool, Node and clients/node's packages): only
# `make test` installs them, so the image that `make setup` builds stays without them.
TOOLS_STAMP := .venv/.test-tools

$(TOOLS_STAMP): $(STAMP) scripts/setup_test_tools.sh clients/node/package-lock.json
	bash scripts/setup_test_tools.sh
	touch $(TOOLS_STAMP)

test-tools: $(TOOLS_STAMP)

# The tritonclient conformance tests' own venv (it needs protobuf < 7; the project's has 7).
TRITON_STAMP := .venv-triton/.installed

$(TRITON_STAMP): requirements-triton.lock scripts/setup_triton.sh
	bash scripts/setup_triton.sh
	touch $(TRITON_STAMP)

# The llama.cpp server for bench.smollm2 (benchmarks only): built from source by pip, CPU, default flags.
LLAMACPP_STAMP := .venv-llamacpp/.installed

$(LLAMACPP_STAMP): requirements-llamacpp.lock
	python3 -m venv .venv-llamacpp
	.venv-llamacpp/bin/pip install -r requirements-llamacpp.lock
	touch $(LLAMACPP_STAMP)

bench-llamacpp: $(LLAMACPP_STAMP)

up: $(STAMP)
	.venv/bin/sluice up

proto: $(STAMP)
	bash scripts/gen_protos.sh

proto-check: $(STAMP)
	bash scripts/check_protos.sh

# The wheels scripts/cuda_check.sh installs offline on a GPU machine without registry access, for its
# CPython CUDA_PY (the lent machines': 3.12), into wheels/cuda-pyXY/; fails over the 64 MiB that travels.
CUDA_PY ?= 3.12

cuda-wheels:
	bash scripts/cuda_wheels.sh $(CUDA_PY)

lint: $(STAMP)
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

# The admission, cancellation and deadline suites run a second time against two front-end processes
# (docs/frontends.md): every server those tests start takes `--frontends 2`; tests marked one_frontend
# (no server, or engine-only checks) are left out of that run.
FRONTEND_SUITES := tests/integration/test_admission.py tests/integration/test_cancellation.py \
	tests/integration/test_hostile_peers.py tests/integration/test_hostile_input.py \
	tests/integration/test_lifecycle.py tests/integration/test_auth.py tests/integration/test_request_budget.py

# Test processes side by side (pytest-xdist): most of a run is server and shim start-ups and waits, so two
# workers fill the 2-core CI machine. Whole modules go to one worker (--dist loadfile) so a module-scoped
# server is started once; longest module first (tests/support/module_order.py; xdist's own reorder, by
# the number of tests, is turned off). TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# Tests marked serial compare wall times (a bystander's latency under an attack against a quiet one, a
# reconnect's or a batch's wall time): they run after the parallel pass, alone, where another worker's load
# cannot tilt them. The parallel pass writes their node ids to SERIAL_LIST (tests/support/serial_list.py), so
# the serial pass collects their 8 modules, not the whole suite again (~15 s).
SERIAL_LIST := .serial-tests

# CI=true: a test skipped for a missing tool fails instead, naming it (tests/support/skips.py); CUDA may skip.
# The parallel pass does not wait for lint: under `make -j3` (.ci/run) mypy's minute on one core runs beside
# it, and the serial pass (test's own recipe) starts only once both are done, on a quiet machine.
test-parallel: $(STAMP) $(TOOLS_STAMP) $(TRITON_STAMP) proto-check
	CI=true $(PY) -m pytest $(PARALLEL) -m "not serial" --serial-list=$(SERIAL_LIST)

test: test-parallel lint
	CI=true $(PY) -m pytest -p no:cacheprovider -m serial @$(SERIAL_LIST)
	CI=true SLUICE_TEST_FRONTENDS=2 $(PY) -m pytest -p no:cacheprovider $(PARALLEL) \
		-m "not one_frontend and not serial" $(FRONTEND_SUITES)
	CI=true SLUICE_TEST_FRONTENDS=2 $(PY) -m pytest -p no:cacheprovider -m "serial and not one_frontend" \
		$(FRONTEND_SUITES)
