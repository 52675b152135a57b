"""StepBatch: one scheduler step as the runtime is handed it (vLLM's SchedulerOutput): the prefill chunks
(Prefill), the decoding rows with their input tokens and positions, and each row's request extras, so that
a per-row input (an adapter slot) reaches the model's forward without changing any runtime's signature.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from server.runtimes.lora import RowAdapter


@dataclass(frozen=True, slots=True)
class Prefill:
    """Prompt tokens to write into the region at arena token `base`, from position `start`: a whole prompt,
    its rest after a cached prefix, or one chunk of a long one; `last` when the chunk ends the prompt (its
    last logits are wanted)."""

    base: int
    token_ids: Sequence[int]
    start: int = 0
    last: bool = True
    shared_base: int = 0  # where a prefix held in another region starts (issue 37) ...
    shared: int = 0  # ... and its tokens: positions [0, shared) are read there, not at base


class RowExtras(RowAdapter, Protocol):
    """What a runtime may read of one row's request extras (server/batching/extras.py's RequestExtras is
    one): a per-request model extra a runtime uses is declared here as well (the row's LoRA adapter)."""


@dataclass(frozen=True, slots=True)
class StepBatch:
    """Rows in logits order: the prefill chunks (those that end their prompt give a row), then one row per
    decoding sequence; the extras run parallel to `prefills` and to `bases`."""

    prefills: Sequence[Prefill]
    bases: Sequence[int]  # per decoding row: its region's first arena token
    tokens: torch.Tensor  # [B] per decoding row: its input token
    positions: torch.Tensor  # [B] per decoding row: the input token's position in its sequence
    prefill_extras: Sequence[RowExtras] = ()  # per prefill chunk: its request's extras
    decode_extras: Sequence[RowExtras] = ()  # per decoding row: its request's extras
    prefixes: Sequence[tuple[int, int]] = ()  # per decoding row: (arena token, tokens) of a shared prefix
