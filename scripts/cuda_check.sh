#!/usr/bin/env bash
# Runs every CUDA-marked test, then bench.hf_generate, on the GPU and prints what each measured; for a machine
# with a GPU (CI has none). In .venv where there is one; otherwise with ${SLUICE_PYTHON:-python3}'s own torch
# and the wheels of `make cuda-wheels` (wheels/cuda-pyXY/), installed offline: the GPU machines `device`
# lends have no registry access. Without a GPU the tests skip, the bench does not run, and it exits 0.
# Finishes within ~9 minutes (SLUICE_CUDA_CHECK_S), under the 10 a lent machine gives one command.
# Usage: [SLUICE_PYTHON=/opt/torch/.venv/bin/python3] scripts/cuda_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
deadline=$((SECONDS + ${SLUICE_CUDA_CHECK_S:-530}))
# What the bench needs at least, on an H200 about a minute (--quick): the tests get the rest.
bench_reserve_s=150
site=""
# Seconds to the deadline less $1, at least 1 (`timeout 0` would mean none).
left() { local s=$((deadline - SECONDS - ${1:-0})); echo $((s > 1 ? s : 1)); }

if [ -x .venv/bin/python ]; then
  py=.venv/bin/python
else
  py="${SLUICE_PYTHON:-python3}"
  if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "cuda_check: no .venv, and $py has no torch: name the python that has one in SLUICE_PYTHON" >&2
    exit 1
  fi
  tag=$("$py" -c 'import sys; print(f"{sys.version_info.major}{sys.version_info.minor}")')
  wheels="wheels/cuda-py$tag"
  if ! compgen -G "$wheels/*.whl" >/dev/null; then
    echo "cuda_check: no .venv and no $wheels: run \`make cuda-wheels CUDA_PY=${tag:0:1}.${tag:1}\` on a" \
      "machine with registry access and carry $wheels here (or \`make setup\` where there is access)" >&2
    exit 1
  fi
  # Installed into a folder put first on PYTHONPATH, not into a venv made on top: the lent python is itself
  # a venv, and a venv made from one sees the base interpreter's packages, not that venv's torch. Ahead of
  # site-packages, the carried protobuf, grpcio and typing-extensions win over the older ones there;
  # --no-deps because everything else (torch, transformers, pytest...) is that python's own.
  site="$PWD/build/cuda-site-py$tag"
  rm -rf "$site"
  "$py" -m pip install --disable-pip-version-check --quiet --no-index --no-deps --no-warn-script-location \
    --target "$site" "$wheels"/*.whl
  # The repository itself from its root and protos/ (the generated code), as `pip install -e .` would.
  export PYTHONPATH="$site:$PWD:$PWD/protos${PYTHONPATH:+:$PYTHONPATH}"
fi

# What runs, and proof that the carried packages are the ones imported (a pre-existing regular `google`
# package, for one, would hide the carried google.protobuf).
CUDA_SITE="$site" "$py" - <<'PY'
import os
import sys

import google.protobuf
import grpc
import pydantic
import torch
import transformers
import typing_extensions

print(f"python {sys.version.split()[0]} ({sys.executable}), torch {torch.__version__}, transformers "
      f"{transformers.__version__}, protobuf {google.protobuf.__version__}, grpcio {grpc.__version__}")
site = os.environ["CUDA_SITE"]
if site:
    stray = [m.__name__ for m in (google.protobuf, grpc, pydantic, typing_extensions)
             if not os.path.realpath(m.__file__).startswith(os.path.realpath(site))]
    if stray:
        raise SystemExit(f"cuda_check: {', '.join(stray)} imported from outside {site}")
if torch.cuda.is_available():
    print(f"CUDA {torch.version.cuda}: {torch.cuda.get_device_name()}")
else:
    print(f"torch {torch.__version__} sees no CUDA device: the CUDA tests skip and the bench does not run "
          "(in .venv on a GPU machine, install a CUDA build of torch there first: setup installs the CPU "
          "one)")
PY
cuda=$("$py" -c 'import torch; print(int(torch.cuda.is_available()))')

tests=0
PYTHONUNBUFFERED=1 timeout -k 10 "$(left "$bench_reserve_s")" \
  "$py" -m pytest -m cuda tests/cuda -s -v -p no:cacheprovider || tests=$?

bench=0
if [ "$cuda" = 1 ]; then
  # The server and the raw transformers loop both on the GPU, in float32, so /raw compares like with like.
  echo
  PYTHONUNBUFFERED=1 timeout -k 10 "$(left)" "$py" -m bench.hf_generate --quick --device cuda || bench=$?
else
  echo "bench.hf_generate: skipped, no CUDA device"
fi

# 124: that step ran out of its time.
echo "cuda_check: CUDA tests exit $tests, bench exit $bench"
[ "$tests" = 0 ] && [ "$bench" = 0 ]
