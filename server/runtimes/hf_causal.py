"""Hugging Face causal LMs (the optional `transformers` extra): the loader that picks the native Llama-family
decoder where it can run the checkpoint, and the generic path for every other architecture.

The generic path runs the model with HF's own attention; its keys/values for each sequence are kept in the
server's KV arena and handed back as a padded DynamicCache for each batched decode step (padding masked
out, positions explicit). It copies the rows it decodes every step, which the native decoder does not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from server.kv.tensors import KvTensors
from server.runtimes.base import GenerativeModel
from server.runtimes.hf_checkpoint import HfCheckpoint, HfGenerativeModel
from server.runtimes.lora import LoraAdapter
from server.runtimes.lora_hf import LoraHooks, read_hf_adapter
from server.runtimes.lora_limits import LoraLimits
from server.runtimes.step_batch import RowExtras, StepBatch

log = logging.getLogger(__name__)


def load_hf_causal(
    path: Path,
    *,
    name: str,
    context_length: int,
    max_sequences: int,
    device: torch.device,
    dtype: torch.dtype,
    engine: str = "auto",
    quantization: str = "none",
) -> GenerativeModel:
    """The native decoder where its table of architectures (architectures.py) runs the checkpoint, else the
    generic path; `engine` (native, generic) insists on one. `path` may name a GGUF file (or a directory
    holding one), which only the native decoder serves. `quantization` (none, int8, int4) packs the linear
    layers' weights (quantized.py)."""
    from server.runtimes.gguf_file import gguf_file
    from server.runtimes.hf_native import LlamaFamilyLm
    from server.runtimes.llama import unsupported

    started = time.perf_counter()
    path = gguf_file(path) or path
    checkpoint = HfCheckpoint(path, context_length=context_length)
    reason = unsupported(checkpoint.config, path) if engine != "generic" else "engine=generic was asked"
    if reason is not None and (engine == "native" or path.suffix == ".gguf"):
        raise ValueError(f"invalid setting hf_models: {name}={path} cannot be served natively: {reason}")
    if reason is None:
        read = time.perf_counter()
        model = LlamaFamilyLm(
            checkpoint, name=name, max_sequences=max_sequences, device=device, dtype=dtype,
            quantization=quantization,
        )  # fmt: skip
        done = time.perf_counter()
        log.info(
            "%s loaded from %s in %.1f s (config and tokenizer %.1f s, weights to %s %.1f s); weights "
            "%.1f MiB resident, quantization %s",
            *(name, path, done - started, read - started, dtype, done - read),
            *(model.decoder.weights_bytes() / 2**20, quantization),
        )
        return model
    log.info("%s runs on the generic Hugging Face path: %s", name, reason)
    return HfCausalLm(
        checkpoint, name=name, max_sequences=max_sequences, device=device, dtype=dtype,
        quantization=quantization,
    )  # fmt: skip


class HfCausalLm(HfGenerativeModel):
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
        from transformers import AutoModelForCausalLM

        from server.runtimes.hf_quantized import quantize_linears

        engine = "generic transformers path"
        super().__init__(
            checkpoint, name=name, max_sequences=max_sequences, device=device, engine=engine,
            dtype=dtype, quantization=quantization,
        )  # fmt: skip
        self.dtype = dtype
        loaded: Any = AutoModelForCausalLM.from_pretrained(checkpoint.path, dtype=dtype)
        self.model: Any = loaded.to(device).eval()
        quantize_linears(self.model, quantization, dtype, device)
        config: Any = self.model.config
        layers = int(config.num_hidden_layers)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self.kv = KvTensors(layers, kv_heads, head_dim, dtype=dtype, device=device)
        self._hooks: LoraHooks | None = None  # installed with the first adapter (lora_hf.py)

    def read_adapter(self, name: str, path: Path, limits: LoraLimits) -> LoraAdapter:
        adapter = read_hf_adapter(name, path, self.model, limits, dtype=self.dtype, device=self.device)
        if self._hooks is None:
            self._hooks = LoraHooks(self.model)
        return adapter

    def step(self, batch: StepBatch, *, computing: Callable[[], None] = lambda: None) -> torch.Tensor:
        hooks = self._hooks
        if hooks is None:
            return super().step(batch, computing=computing)
        computing()
        parts = []
        try:
            if batch.prefills:  # one prompt a call: its one row's adapter
                extras: Sequence[RowExtras | None] = batch.prefill_extras or [None] * len(batch.prefills)
                logits = []
                for prompt, row in zip(batch.prefills, extras, strict=True):
                    hooks.set([row.adapter if row is not None else None])
                    logits.append(self.prefill(prompt.base, prompt.token_ids, prompt.start))
                parts.append(torch.stack(logits))
            if batch.bases:
                hooks.set([row.adapter for row in batch.decode_extras])
                parts.append(self.decode(batch.bases, batch.tokens, batch.positions))
        finally:
            hooks.set(())
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _past(self, rows: torch.Tensor, span: int) -> Any:
        """The keys and values of tokens rows[b] + [0, span) as HF's cache, [B, kv, span, dim] per layer."""
        from transformers import DynamicCache

        cache = DynamicCache()
        index = (rows[:, None] + torch.arange(span, device=self.device)[None, :]).clamp(
            max=self.kv.k.shape[2] - 1
        )
        for layer in range(self.kv.layers):
            keys = self.kv.k[layer][:, index].transpose(0, 1)
            values = self.kv.v[layer][:, index].transpose(0, 1)
            cache.update(keys, values, layer)
        return cache

    def prefill(self, base: int, token_ids: Sequence[int], start: int = 0) -> torch.Tensor:
        n = len(token_ids)
        ids = torch.tensor([list(token_ids)], device=self.device)
        past = self._past(torch.tensor([base], device=self.device), start) if start else None
        out = self.model(
            input_ids=ids,
            position_ids=torch.arange(start, start + n, device=self.device)[None],
            past_key_values=past,
            use_cache=True,
        )
        for layer, cached in enumerate(out.past_key_values.layers):
            self.kv.k[layer][:, base + start : base + start + n] = cached.keys[0, :, start:]
            self.kv.v[layer][:, base + start : base + start + n] = cached.values[0, :, start:]
        logits: torch.Tensor = out.logits[0, -1]
        return logits

    def decode(self, bases: Sequence[int], tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        span = int(positions.max())
        rows = torch.as_tensor(bases, device=self.device)
        cache = self._past(rows, span)
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
        at = rows + positions
        for layer, cached in enumerate(out.past_key_values.layers):
            self.kv.k[layer][:, at] = cached.keys[:, :, span].transpose(0, 1)
            self.kv.v[layer][:, at] = cached.values[:, :, span].transpose(0, 1)
        logits: torch.Tensor = out.logits[:, -1]
        return logits
