#!/usr/bin/env bash
# CI gate for the contract: buf lint + format, buf breaking against main, and generated code not stale.
set -euo pipefail
cd "$(dirname "$0")/.."
buf=.venv/bin/buf
"$buf" lint
"$buf" format --diff --exit-code
# Breaking changes are judged against the last commit of main that is not this one (origin/main when the
# clone has it, else HEAD~1), provided that commit has the protos; a first commit has nothing to break.
against=""
for ref in origin/main HEAD~1; do
  if git rev-parse -q --verify "$ref^{commit}" >/dev/null && [ "$(git rev-parse "$ref")" != "$(git rev-parse HEAD)" ] \
     && git cat-file -e "$ref:protos/sluice" 2>/dev/null; then
    against=$ref
    break
  fi
done
if [ -n "$against" ]; then
  "$buf" breaking --against ".git#ref=$(git rev-parse "$against")"
  echo "buf breaking: no breaking change against $against"
else
  echo "buf breaking: skipped (no earlier commit with protos in this clone)"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bash scripts/gen_protos.sh "$tmp"
if ! diff -r -x __pycache__ "$tmp/sluice" protos/sluice -x '*.proto' >/dev/null; then
  diff -r -x __pycache__ -x '*.proto' "$tmp/sluice" protos/sluice | head -20
  echo "generated code is stale: run 'make proto' and commit the result" >&2
  exit 1
fi
echo "generated code is up to date"
