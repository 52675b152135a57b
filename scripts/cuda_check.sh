#!/usr/bin/env bash
# Runs every CUDA-marked test and prints what each measured; for a machine with a GPU (CI has none).
# Usage: scripts/cuda_check.sh   (sets up .venv first if needed)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
.venv/bin/python -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.cuda.get_device_name())'
PYTHONUNBUFFERED=1 .venv/bin/python -m pytest -m cuda tests/cuda -s -v -p no:cacheprovider
