"""LlamaFamilyLm: a Llama, Mistral or Qwen2 checkpoint served by the native decoder (runtimes/llama.py), with
prefill and decode fused into one pass per step and long prompts prefilled in chunks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from server.runtimes.architectures import Architecture, architecture_of
from server.runtimes.base import Prefill
from server.runtimes.hf_checkpoint import HfCheckpoint, HfGenerativeModel
from server.runtimes.llama import LlamaDecoder
from server.runtimes.lora import LoraAdapter, LoraLimits, read_adapter
from server.runtimes.lora_stack import LoraStacks
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
        self._stacks: LoraStacks | None = None  # from the first adapter's load on
        self.decoder = LlamaDecoder(
            checkpoint.path, checkpoint.config, dtype=dtype, device=device, quantization=quantization
        )
        self.kv = self.decoder.kv
        # A sliding window would have to reach across a shared prefix and the own part: Mistral copies.
        self.shares_prefixes = self.decoder.geometry.window is None

    def step(self, batch: StepBatch, *, computing: Callable[[], None] = lambda: None) -> torch.Tensor:
        lora = ([], []) if self._stacks is None else self._stacks.segments(
            [len(p.token_ids) for p in batch.prefills], batch.prefill_extras, batch.decode_extras
        )  # fmt: skip
        return self.decoder.forward(
            batch.prefills, batch.bases, batch.tokens, batch.positions, computing=computing,
            prefixes=batch.prefixes, lora=lora,
        )  # fmt: skip

    def read_adapter(self, name: str, path: Path, limits: LoraLimits) -> LoraAdapter:
        # From the first adapter on, every step stacks its rows' adapters (an unloaded adapter's running
        # sequences keep theirs); before it, the step is the base model's alone, with no per-row Python.
        if self._stacks is None:
            self._stacks = LoraStacks(self.decoder.dtype, self.device)
        config, decoder = self.checkpoint.config, self.decoder
        layout = architecture_of(config)
        assert isinstance(layout, Architecture)  # the native decoder runs only what the table names
        hidden, inner = int(config.hidden_size), int(config.intermediate_size)
        q, kv = decoder.heads * decoder.head_dim, decoder.kv_heads * decoder.head_dim
        shapes = dict(zip(layout.attention, [(hidden, q), (hidden, kv), (hidden, kv)], strict=True))
        shapes |= {layout.attention_out: (q, hidden), layout.mlp_out: (inner, hidden)}
        shapes |= dict.fromkeys(layout.mlp, (hidden, inner))
        return read_adapter(
            name, path, layout, shapes, len(decoder.weights), limits, dtype=decoder.dtype, device=self.device
        )

    def adapters_changed(self) -> None:
        if self._stacks is not None:
            self._stacks.restack(self.adapters.values())

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
