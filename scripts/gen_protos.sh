#!/usr/bin/env bash
# Regenerates the Python protobuf/gRPC modules and their .pyi stubs beside the .proto files.
# Usage: scripts/gen_protos.sh [OUTDIR]   (default: protos; CI generates into a temp dir and diffs)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
bin="$root/.venv/bin"
out=$(realpath -m "${1:-protos}")
mkdir -p "$out"
mapfile -t files < <(cd protos && find sluice -name '*.proto' | sort)
(cd protos && "$bin/python" -m grpc_tools.protoc -I . \
  --plugin=protoc-gen-mypy="$bin/protoc-gen-mypy" \
  --plugin=protoc-gen-mypy_grpc="$bin/protoc-gen-mypy_grpc" \
  --python_out="$out" --mypy_out=quiet:"$out" --grpc_python_out="$out" --mypy_grpc_out=quiet:"$out" \
  "${files[@]}")
# Regular packages (not namespace packages) so that mypy and setuptools find them.
find "$out/sluice" -type d -not -name __pycache__ -exec sh -c 'touch "$1/__init__.py"' _ {} \;
