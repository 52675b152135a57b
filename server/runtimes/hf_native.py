"""LlamaFamilyLm: a Llama, Mistral or Qwen2 checkpoint served by the native decoder (runtimes/llama.py), with
prefill and decode fused into one pass per step and long prompts prefilled in chunks."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from server.runtimes.base import Prefill
from server.runtimes.hf_checkpoint import HfCheckpoint, HfGenerativeModel
from server.runtimes.llama import LlamaDecoder


class LlamaFamilyLm(HfGenerativeModel):
    chunked_prefill = True

    def __init__(
        self,
        checkpoint: HfCheckpoint,
        *,
        name: str,
        max_sequences: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        engine = f"native decoder, {dtype}"
        super().__init__(checkpoint, name=name, max_sequences=max_sequences, device=device, engine=engine)
        self._no_rows = torch.empty(0, dtype=torch.long, device=device)
        self.decoder = LlamaDecoder(checkpoint.path, checkpoint.config, dtype=dtype, device=device)

    def slot_bytes(self, context_length: int) -> int:
        return self.decoder.slot_bytes(min(context_length, self.context_length))

    def allocate_cache(self, slots: int, context_length: int) -> int:
        return self.decoder.allocate(slots, min(context_length, self.context_length))

    def forward(
        self, prefills: Sequence[Prefill], slots: Sequence[int], tokens: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        return self.decoder.forward(prefills, slots, tokens, positions)

    def prefill(self, slot: int, token_ids: Sequence[int]) -> torch.Tensor:
        return self.decoder.forward([Prefill(slot, token_ids)], [], self._no_rows, self._no_rows)[0]

    def prefill_many(self, prompts: Sequence[tuple[int, Sequence[int]]]) -> torch.Tensor:
        return self.decoder.forward(
            [Prefill(slot, ids) for slot, ids in prompts], [], self._no_rows, self._no_rows
        )

    def decode(self, slots: Sequence[int], tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.decoder.forward([], slots, tokens, positions)
