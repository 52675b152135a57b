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


def kv_slots(
    model: GenerativeModel, settings: Settings, context_length: int, reading: MemoryReading
) -> tuple[int, str]:
    """KV-cache slots for a generative model: --max-sequences, fewer where the --kv-cache-memory fraction of
    the memory free now does not hold that many; with how it was decided, for the start-up log."""
    per_slot = model.slot_bytes(context_length)
    if per_slot is None:
        return settings.max_sequences, "--max-sequences; the runtime does not say its slot size"
    free = max(reading.budget_bytes - reading.used_bytes, 0)
    fits = int(free * settings.kv_cache_memory) // max(per_slot, 1)
    if fits < 1:
        raise ValueError(
            f"invalid setting context_length: one KV-cache slot of {context_length} tokens takes "
            f"{per_slot / 2**20:.1f} MiB, more than {settings.kv_cache_memory} x {free / 2**20:.0f} MiB "
            "free; lower --context-length or raise --kv-cache-memory"
        )
    slots = min(settings.max_sequences, fits)
    bound = "--max-sequences" if slots == settings.max_sequences else "memory"
    return slots, (
        f"{bound}: {settings.kv_cache_memory} x free {free / 2**20:.0f} MiB / {per_slot / 2**20:.2f} MiB "
        f"per slot = {fits} slots, --max-sequences {settings.max_sequences}"
    )


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

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self.total += value.numel() * value.element_size()
        return out
