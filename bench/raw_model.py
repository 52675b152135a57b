"""The limit: the bare model loop in-process, `net(torch.randn(batch, 512))` under inference_mode."""

from __future__ import annotations

import time

import torch

from server.runtimes.mlp import build_mlp

FEATURES = 512


def raw_items_per_s(
    *, width: int, batch: int, warmup_s: float, duration_s: float, max_iterations: int = 100_000
) -> float:
    """Items/s of back-to-back forward passes at `batch`, after `warmup_s`, timed over ~`duration_s`.

    Uses the calling process's torch thread setting; set torch.set_num_threads first.
    """
    net = build_mlp(width)
    x = torch.randn(batch, FEATURES, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        end_warmup = time.perf_counter() + warmup_s
        for _ in range(max_iterations):
            net(x)
            if time.perf_counter() >= end_warmup:
                break
        start = time.perf_counter()
        iterations = 0
        while iterations < max_iterations:
            net(x)
            iterations += 1
            if time.perf_counter() - start >= duration_s:
                break
        elapsed = time.perf_counter() - start
    return iterations * batch / elapsed
