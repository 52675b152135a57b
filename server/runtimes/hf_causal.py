"""Hugging Face causal LMs (the optional `transformers` extra): the loader that picks the native Llama-family
decoder where it can run the checkpoint, and the generic path for every other architecture.

The generic path runs the model with HF's own attention; its keys/values for each sequence are kept in
server-owned slots and handed back as a padded DynamicCache for each batched decode step (padding masked
out, positions explicit). It copies the rows it decodes every step, which the native decoder does not.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from server.runtimes.base import GenerativeModel
from server.runtimes.hf_checkpoint import HfCheckpoint, HfGenerativeModel

log = logging.getLogger(__name__)


def load_hf_causal(
    path: Path,
    *,
    name: str,
    context_length: int,
    max_sequences: int,
    device: torch.device,
    dtype: torch.dtype,
) -> GenerativeModel:
    """The native decoder for Llama, Mistral and Qwen2 checkpoints it supports, else the generic path."""
    from server.runtimes.hf_native import LlamaFamilyLm
    from server.runtimes.llama import unsupported

    checkpoint = HfCheckpoint(path, context_length=context_length)
    reason = unsupported(checkpoint.config, path)
    if reason is None:
        return LlamaFamilyLm(checkpoint, name=name, max_sequences=max_sequences, device=device, dtype=dtype)
    log.info("%s runs on the generic Hugging Face path: %s", name, reason)
    return HfCausalLm(checkpoint, name=name, max_sequences=max_sequences, device=device, dtype=dtype)


class HfCausalLm(HfGenerativeModel):
    def __init__(
        self,
        checkpoint: HfCheckpoint,
        *,
        name: str,
        max_sequences: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        from transformers import AutoModelForCausalLM

        engine = "generic transformers path"
        super().__init__(checkpoint, name=name, max_sequences=max_sequences, device=device, engine=engine)
        self.dtype = dtype
        loaded: Any = AutoModelForCausalLM.from_pretrained(checkpoint.path, dtype=dtype)
        self.model: Any = loaded.to(device).eval()
        config: Any = self.model.config
        self.layers = int(config.num_hidden_layers)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        self.head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def slot_bytes(self, context_length: int) -> int:
        size = torch.empty(0, dtype=self.dtype).element_size()
        return (
            2 * self.layers * self.kv_heads * min(context_length, self.context_length) * self.head_dim * size
        )

    def allocate_cache(self, slots: int, context_length: int) -> int:
        dims = (self.layers, slots, self.kv_heads, min(context_length, self.context_length), self.head_dim)
        self.k_cache = torch.zeros(dims, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(dims, dtype=self.dtype, device=self.device)
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

    def prefill(self, slot: int, token_ids: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor([list(token_ids)], device=self.device)
        out = self.model(input_ids=ids, use_cache=True)
        n = len(token_ids)
        for layer, cached in enumerate(out.past_key_values.layers):
            self.k_cache[layer, slot, :, :n] = cached.keys[0]
            self.v_cache[layer, slot, :, :n] = cached.values[0]
        logits: torch.Tensor = out.logits[0, -1]
        return logits

    def decode(self, slots: Sequence[int], tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        from transformers import DynamicCache

        span = int(positions.max())
        index = torch.as_tensor(slots, device=self.device)
        cache = DynamicCache()
        for layer in range(self.layers):
            cache.update(self.k_cache[layer, index, :, :span], self.v_cache[layer, index, :, :span], layer)
        # Row b holds positions[b] real tokens, right-padded to span; the new token sits at index span.
        mask = torch.arange(span + 1, device=self.device)[None, :] < positions[:, None]
        mask[:, span] = True
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=mask.long(),
            position_ids=positions[:, None],
            past_key_values=cache,
            use_cache=True,
        )
        for layer, cached in enumerate(out.past_key_values.layers):
            self.k_cache[layer, index, :, positions] = cached.keys[:, :, span]
            self.v_cache[layer, index, :, positions] = cached.values[:, :, span]
        logits: torch.Tensor = out.logits[:, -1]
        return logits
