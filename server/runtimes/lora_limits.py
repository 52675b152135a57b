"""What bounds the LoRA adapters a model serves (--max-lora-rank, --max-loras), and the error an adapter
that cannot be served raises: apart from server/runtimes/lora.py so that the flags read them without torch."""

from __future__ import annotations

from dataclasses import dataclass


class AdapterError(ValueError):
    """An adapter that cannot be served; the message names the file or the setting."""


@dataclass(frozen=True, slots=True)
class LoraLimits:
    """--max-lora-rank and --max-loras (adapters a replica holds loaded, every one usable in any step)."""

    max_rank: int = 16
    max_loras: int = 4
