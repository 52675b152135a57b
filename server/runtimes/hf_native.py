"""LlamaFamilyLm: a Llama, Mistral or Qwen2 checkpoint served by the native decoder (runtimes/llama.py), with
prefill and decode fused into one pass per step and long prompts prefilled in chunks."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from server.domain import ChatTurn
from server.runtimes.base import GenerativeModel, Prefill
from server.runtimes.hf_checkpoint import HfCheckpoint
from server.runtimes.llama import LlamaDecoder


class LlamaFamilyLm(GenerativeModel):
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
        self.checkpoint = checkpoint
        self.device = device
        self._no_rows = torch.empty(0, dtype=torch.long, device=device)
        self.decoder = LlamaDecoder(checkpoint.path, checkpoint.config, dtype=dtype, device=device)
        self.vocab_size = checkpoint.vocab_size
        self.eos_id = checkpoint.eos_id
        self.strips_leading_space = checkpoint.strips_leading_space
        self.context_length = checkpoint.context_length
        self.descriptor = checkpoint.descriptor(
            name, max_sequences=max_sequences, device=device, engine=f"native decoder, {dtype}"
        )

    def encode(self, text: str) -> list[int]:
        return self.checkpoint.encode(text)

    def chat_prompt(self, turns: Sequence[ChatTurn]) -> list[int]:
        return self.checkpoint.chat_prompt(turns)

    def token_bytes(self, token_id: int) -> bytes:
        return self.checkpoint.token_bytes[token_id]

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
