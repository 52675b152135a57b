"""Memory probes: what the breaker samples. CUDA device memory, host process memory, or a fake for tests."""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch


@dataclass(frozen=True, slots=True)
class MemoryReading:
    used_bytes: int
    reserved_bytes: int
    budget_bytes: int

    @property
    def fraction(self) -> float:
        return self.used_bytes / self.budget_bytes if self.budget_bytes else 0.0


class MemoryProbe(abc.ABC):
    name: str

    @abc.abstractmethod
    def read(self) -> MemoryReading:
        """Samples memory now; called from the breaker's background task, never per request."""


class HostProbe(MemoryProbe):
    """Resident set size of this process against a budget (default: the machine's total memory)."""

    name = "host"

    def __init__(self, budget_bytes: int = 0) -> None:
        self._process = psutil.Process(os.getpid())
        self.budget_bytes = budget_bytes or psutil.virtual_memory().total

    def read(self) -> MemoryReading:
        rss = int(self._process.memory_info().rss)
        return MemoryReading(used_bytes=rss, reserved_bytes=rss, budget_bytes=self.budget_bytes)


class CudaProbe(MemoryProbe):
    """Device memory in use (all processes, from mem_get_info) against the device total or a budget."""

    name = "cuda"

    def __init__(self, device: torch.device, budget_bytes: int = 0) -> None:
        self.device = device
        _free, total = torch.cuda.mem_get_info(device)
        self.budget_bytes = min(budget_bytes, total) if budget_bytes else total

    def read(self) -> MemoryReading:
        free, total = torch.cuda.mem_get_info(self.device)
        return MemoryReading(
            used_bytes=total - free,
            reserved_bytes=int(torch.cuda.memory_reserved(self.device)),
            budget_bytes=self.budget_bytes,
        )


class FakeProbe(MemoryProbe):
    """Reads the used fraction (e.g. `0.95`) from a file a test writes; a missing file reads as 0.

    An empty or unparsable file keeps the previous reading: a writer that truncates before writing
    would otherwise show the breaker a momentary 0 and close it.
    """

    name = "fake"

    def __init__(self, path: Path, budget_bytes: int = 1 << 30) -> None:
        self.path = path
        self.budget_bytes = budget_bytes
        self._fraction = 0.0

    def read(self) -> MemoryReading:
        try:
            self._fraction = float(self.path.read_text().strip())
        except FileNotFoundError:
            self._fraction = 0.0
        except ValueError:
            pass
        used = int(self._fraction * self.budget_bytes)
        return MemoryReading(used_bytes=used, reserved_bytes=used, budget_bytes=self.budget_bytes)


def make_probe(spec: str, device: torch.device, budget_bytes: int) -> MemoryProbe:
    """`auto` picks CUDA when the models run on a GPU and host memory otherwise."""
    if spec.startswith("fake:"):
        return FakeProbe(Path(spec.removeprefix("fake:")), budget_bytes or 1 << 30)
    if spec == "cuda" or (spec == "auto" and device.type == "cuda"):
        if not torch.cuda.is_available():
            raise ValueError("invalid setting memory_probe: cuda requested but torch sees no CUDA device")
        return CudaProbe(device if device.type == "cuda" else torch.device("cuda"), budget_bytes)
    return HostProbe(budget_bytes)
