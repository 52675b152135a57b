#!/usr/bin/env bash
# Creates .venv-triton with the pinned, unchanged tritonclient that the v2 conformance tests run as a
# subprocess (tests/integration/test_kserve_tritonclient.py): it requires protobuf < 7, the project's venv
# has protobuf 7, so the two cannot share an interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-triton
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; return "${PIPESTATUS[0]}"; }
quiet .venv-triton/bin/python -m pip install --disable-pip-version-check --quiet -r requirements-triton.lock
