"""Hugging Face causal LMs (the optional `transformers` extra) behind the same slot-indexed KV cache.

The model runs with HF's own attention; its keys/values for each sequence are kept in server-owned slots
and handed back as a padded DynamicCache for each batched decode step (padding masked out, positions
explicit), so it shares the continuous scheduler with the embedded byte LM.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from server.domain import ChatTurn, ModelDescriptor, ModelKind, ModelLimits
from server.runtimes.base import GenerativeModel


class HfCausalLm(GenerativeModel):
    def __init__(
        self, path: Path, *, name: str, context_length: int, max_sequences: int, device: torch.device
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.device = device
        loaded: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.model: Any = loaded.to(device).eval()
        config: Any = self.model.config
        self.vocab_size = int(config.vocab_size)
        self.layers = int(config.num_hidden_layers)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        self.head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        limit: Any = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        self.context_length = min(context_length, int(limit or context_length))
        self.tokenizer = _load_tokenizer(path)
        self._bytes = _token_bytes_table(self.tokenizer, self.vocab_size)
        eos = getattr(self.tokenizer, "eos_token_id", None) if self.tokenizer else config.eos_token_id
        self.eos_id = eos if isinstance(eos, int) and 0 <= eos < self.vocab_size else None
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.descriptor = ModelDescriptor(
            name=name,
            version=str(getattr(config, "_name_or_path", "") or path.name),
            kind=ModelKind.GENERATIVE,
            description=f"Hugging Face {config.model_type} from {path}",
            limits=ModelLimits(
                max_batch_size=max_sequences,
                context_length=self.context_length,
                max_tokens=self.context_length - 1,
                max_concurrent_sequences=max_sequences,
            ),
            device=str(device),
        )

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return list(text.encode("utf-8"))
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def chat_prompt(self, turns: Sequence[ChatTurn]) -> list[int]:
        """The tokenizer's own chat template when it has one (Llama, Qwen2, ...), else the default."""
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            return super().chat_prompt(turns)
        messages = [{"role": turn.role, "content": turn.content} for turn in turns]
        ids: Any = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if not isinstance(ids, list):  # a BatchEncoding where the tokenizer is set to return dicts
            ids = ids["input_ids"]
        return [int(token) for token in ids]

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[token_id]

    def allocate_cache(self, slots: int, context_length: int) -> int:
        dims = (self.layers, slots, self.kv_heads, min(context_length, self.context_length), self.head_dim)
        self.k_cache = torch.zeros(dims, device=self.device)
        self.v_cache = torch.zeros(dims, device=self.device)
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


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def _load_tokenizer(path: Path) -> Any:
    """The directory's tokenizer, or None: then token ids are bytes (the vocabulary must cover 0-255)."""
    from transformers import AutoTokenizer

    if not any((path / name).exists() for name in _TOKENIZER_FILES):
        return None  # transformers would otherwise invent an empty tokenizer from the model type
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError):
        return None


def _token_bytes_table(tokenizer: Any, vocab_size: int) -> list[bytes]:
    """Each token's raw bytes, computed once, so detokenisation per token is a list lookup."""
    if tokenizer is None:
        if vocab_size < 256:
            raise ValueError(
                "invalid model: without a tokenizer the vocabulary must cover the 256 byte values"
            )
        return [bytes((i,)) if i < 256 else b"" for i in range(vocab_size)]
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_decoder = {c: b for b, c in bytes_to_unicode().items()}  # type: ignore[no-untyped-call]
    special = set(tokenizer.all_special_ids)
    table = []
    for token_id, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(vocab_size)))):
        if piece is None or token_id in special:
            table.append(b"")
        elif (
            piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6
        ):  # sentencepiece byte fallback
            table.append(bytes((int(piece[3:5], 16),)))
        elif all(ch in byte_decoder for ch in piece):  # byte-level BPE (GPT-2 family)
            table.append(bytes(byte_decoder[ch] for ch in piece))
        else:
            table.append(piece.replace("\u2581", " ").encode("utf-8"))
    return table
