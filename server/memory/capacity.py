"""Capacity from measurement: per-request peak memory at a few batch sizes, then
N = (budget - in use now) / per-request peak x (1 - margin), and the largest batch that fits; and for a
generative model, the KV-cache slots the memory free at start-up holds.

On CUDA the peak is torch.cuda.max_memory_allocated around a forward pass. On CPU, where torch's allocator
keeps no statistics, it is an upper bound: the bytes of every intermediate tensor of one forward pass,
counted as if all were live at once. They are counted at the dispatcher, below any module structure, so
functional calls and TorchScript graphs (whose modules fire no forward hooks) count as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from server.config import Settings
from server.memory.probes import MemoryProbe, MemoryReading
from server.runtimes.base import GenerativeModel, TensorModel, synthetic_item

_BATCHES = (1, 8, 32)
_MAX_SLOTS = 1024  # beyond this the queue, not memory, is the bound that matters


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    max_concurrency: int
    max_batch_size: int
    per_request_bytes: int
    free_bytes: int
    weights_bytes: int
    method: str
    margin: float

    def explain(self) -> str:
        return (
            f"N = (free {self.free_bytes / 2**20:.0f} MiB) / per-request peak "
            f"{self.per_request_bytes / 2**10:.1f} KiB x (1 - {self.margin}) = {self.max_concurrency} "
            f"(capped at {_MAX_SLOTS}); max batch {self.max_batch_size}; weights "
            f"{self.weights_bytes / 2**20:.1f} MiB; measured by {self.method}"
        )


def plan_capacity(model: TensorModel, settings: Settings, probe: MemoryProbe) -> CapacityPlan:
    """Runs on the model's worker thread during start-up."""
    net = next((m for m in vars(model).values() if isinstance(m, nn.Module)), None)
    weights = sum(p.numel() * p.element_size() for p in net.parameters()) if net is not None else 0
    device = torch.device(model.descriptor.device)
    per_item = max(_peak_bytes(model, b, device) / b for b in _BATCHES)
    reading = probe.read()
    free = max(reading.budget_bytes - reading.used_bytes, 0)
    fits = int(free / max(per_item, 1.0) * (1 - settings.capacity_margin))
    slots = max(1, min(fits, _MAX_SLOTS))
    return CapacityPlan(
        max_concurrency=slots,
        max_batch_size=max(1, min(settings.max_batch_size, fits)),
        per_request_bytes=int(per_item),
        free_bytes=free,
        weights_bytes=weights,
        method="torch.cuda.max_memory_allocated"
        if device.type == "cuda"
        else "activation bytes (upper bound)",
        margin=settings.capacity_margin,
    )


#: On CPU an automatic KV cache takes at most this (vLLM's CPU default, VLLM_CPU_KVCACHE_SPACE): the host
#: probe's free memory is the whole machine's. Its pages become resident only as tokens are written.
CPU_KV_CACHE_BYTES = 4 * 2**30


def kv_tokens(
    model: GenerativeModel, settings: Settings, context_length: int, reading: MemoryReading
) -> tuple[int, str]:
    """Tokens of a generative model's KV arena: --kv-cache-bytes, else the --kv-cache-memory fraction of
    the memory free now (on CPU at most CPU_KV_CACHE_BYTES); with how it was decided, for the start-up
    log. Raises where the arena would not hold one sequence of `context_length` tokens."""
    per_token = model.kv_bytes_per_token()
    free = max(reading.budget_bytes - reading.used_bytes, 0)
    if settings.kv_cache_bytes:
        budget, how = settings.kv_cache_bytes, "--kv-cache-bytes"
    else:
        budget, how = int(free * settings.kv_cache_memory), f"{settings.kv_cache_memory} x free"
        if model.device.type == "cpu" and budget > CPU_KV_CACHE_BYTES:
            budget, how = CPU_KV_CACHE_BYTES, "the CPU default"
    tokens = budget // max(per_token, 1)
    if tokens < context_length:
        raise ValueError(
            f"invalid setting kv_cache_bytes: {budget / 2**20:.1f} MiB ({how}, free {free / 2**20:.0f} "
            f"MiB) holds {tokens} tokens at {per_token} bytes each, less than one sequence of "
            f"context_length {context_length}; lower --context-length or raise --kv-cache-bytes"
        )
    return tokens, f"{how}: {budget / 2**20:.1f} MiB / {per_token} bytes per token"


def _peak_bytes(model: TensorModel, size: int, device: torch.device) -> float:
    batch = [synthetic_item(model.descriptor)] * size
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        model.forward(batch)
        torch.cuda.synchronize(device)
        return float(torch.cuda.max_memory_allocated(device) - base)
    counter = _OutputBytes()
    with counter:
        model.forward(batch)
    return float(sum(a.nbytes for item in batch for a in item.values()) + counter.total)


class _OutputBytes(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves it untyped
    """Adds up the bytes of every tensor any op returns while active (this thread only)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.total = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # True (torch's default) wraps __torch_dispatch__ in torch._disable_dynamo, whose first call imports
        # torch._dynamo: 1.6 CPU-s of every start that serves a tensor model, for a mode nothing compiles
        # under (a model compiled with torch.compile runs as compiled; Dynamo may trace into this method,
        # which torch documents as the flag's other setting).
        return False

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self.total += value.numel() * value.element_size()
        return out
