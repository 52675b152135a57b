"""LlamaFamilyLm: a Llama, Mistral or Qwen2 checkpoint served by the native decoder (runtimes/llama.py), with
prefill and decode fused into one pass per step and long prompts prefilled in chunks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from server.runtimes.base import Prefill
from server.runtimes.hf_checkpoint import HfCheckpoint, HfGenerativeModel
from server.runtimes.llama import LlamaDecoder
from server.runtimes.step_batch import StepBatch


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
        quantization: str = "none",
    ) -> None:
        super().__init__(
            checkpoint, name=name, max_sequences=max_sequences, device=device, engine="native decoder",
            dtype=dtype, quantization=quantization,
        )  # fmt: skip
        self._no_rows = torch.empty(0, dtype=torch.long, device=device)
        self.decoder = LlamaDecoder(
            checkpoint.path, checkpoint.config, dtype=dtype, device=device, quantization=quantization
        )
        self.kv = self.decoder.kv
        # A sliding window would have to reach across a shared prefix and the own part: Mistral copies.
        self.shares_prefixes = self.decoder.geometry.window is None

    def step(self, batch: StepBatch, *, computing: Callable[[], None] = lambda: None) -> torch.Tensor:
        return self.decoder.forward(
            batch.prefills, batch.bases, batch.tokens, batch.positions, computing=computing,
            prefixes=batch.prefixes,
        )  # fmt: skip

    def allocate_cache(self, tokens: int) -> int:
        return self.decoder.allocate(tokens, self.context_length)

    def forward(
        self,
        prefills: Sequence[Prefill],
        bases: Sequence[int],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        *,
        computing: Callable[[], None] = lambda: None,
    ) -> torch.Tensor:
        return self.decoder.forward(prefills, bases, tokens, positions, computing=computing)

    def prefill(self, base: int, token_ids: Sequence[int], start: int = 0) -> torch.Tensor:
        return self.decoder.forward([Prefill(base, token_ids, start)], [], self._no_rows, self._no_rows)[0]

    def prefill_many(self, prompts: Sequence[Prefill]) -> torch.Tensor:
        return self.decoder.forward(list(prompts), [], self._no_rows, self._no_rows)

    def decode(self, bases: Sequence[int], tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.decoder.forward([], bases, tokens, positions)
