#!/usr/bin/env bash
# Regenerates the Python protobuf/gRPC modules and their .pyi stubs beside the .proto files.
# Usage: scripts/gen_protos.sh [OUTDIR]   (default: protos; CI generates into a temp dir and diffs)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
out=${1:-protos}
mkdir -p "$out"
mapfile -t files < <(cd protos && find sluice -name '*.proto' | sort)
(cd protos && "../$py" -m grpc_tools.protoc -I . \
  --plugin=protoc-gen-mypy="../$(dirname "$py")/protoc-gen-mypy" \
  --plugin=protoc-gen-mypy_grpc="../$(dirname "$py")/protoc-gen-mypy_grpc" \
  --python_out="$(realpath "../$out")" --mypy_out="$(realpath "../$out")" \
  --grpc_python_out="$(realpath "../$out")" --mypy_grpc_out="$(realpath "../$out")" \
  "${files[@]}")
# Regular packages (not namespace packages) so that mypy and setuptools find them.
find "$out/sluice" -type d -exec sh -c 'touch "$1/__init__.py"' _ {} \;
