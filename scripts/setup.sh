#!/usr/bin/env bash
# Creates .venv with pinned dependencies (torch 2.13.0 CPU from the local wheel) and installs Sluice editable.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
pip_args=(--disable-pip-version-check --quiet)
# torch==2.13.0 lies on this machine's disk; never let pip go fetch a multi-GB CUDA build.
[ -d /opt/wheels ] && pip_args+=(--find-links /opt/wheels)
.venv/bin/python -m pip install "${pip_args[@]}" -r requirements.lock
.venv/bin/python -m pip install "${pip_args[@]}" --no-deps --no-build-isolation -e .
if command -v npm >/dev/null 2>&1 && [ -f clients/node/package-lock.json ]; then
  (cd clients/node && npm ci --silent --no-audit --no-fund)
fi
