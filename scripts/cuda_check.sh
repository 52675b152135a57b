#!/usr/bin/env bash
# Runs every CUDA-marked test and prints what each measured; for a machine with a GPU (CI has none).
# Usage: scripts/cuda_check.sh   (sets up .venv first if needed)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
.venv/bin/python - <<'PY'
import torch
if not torch.cuda.is_available():
    raise SystemExit(f"torch {torch.__version__} sees no CUDA device: on a GPU machine install a CUDA build of "
                     "torch 2.13.0 into .venv first (setup installs the CPU wheel)")
print(torch.cuda.get_device_name())
PY
PYTHONUNBUFFERED=1 .venv/bin/python -m pytest -m cuda tests/cuda -s -v -p no:cacheprovider
