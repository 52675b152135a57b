"""What both Hugging Face generative runtimes read from a checkpoint directory besides the weights: the
config, the tokenizer (encoding, chat template, each token's bytes, end of sequence) and the descriptor;
and HfGenerativeModel, the base both runtimes build on it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from server.domain import ChatTurn, ModelDescriptor, ModelKind, ModelLimits
from server.runtimes.base import GENERATION_PROMPT, GenerativeModel, default_chat_text
from server.runtimes.gguf_file import read_config
from server.tools.format import default_tools_turn, default_turns, hf_messages, openai_functions
from wire.constraint import Tool

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


class HfCheckpoint:
    """A checkpoint's text side; token ids are bytes where the directory holds no tokenizer."""

    def __init__(self, path: Path, *, context_length: int) -> None:
        from transformers import AutoConfig

        self.path = path
        # A GGUF file holds the config, tokenizer and chat template itself (gguf_file.py reads them).
        gguf = path.suffix == ".gguf"
        self.config: Any = read_config(path) if gguf else AutoConfig.from_pretrained(path)
        self.vocab_size = int(self.config.vocab_size)
        limit: Any = getattr(self.config, "max_position_embeddings", None) or getattr(
            self.config, "n_positions", None
        )
        # --context-length 0: the model's own (a config that names none: 2,048).
        self.context_length = min(context_length or int(limit or 2048), int(limit or context_length or 2048))
        self.tokenizer = _load_tokenizer(path)
        self.token_bytes = _token_bytes_table(self.tokenizer, self.vocab_size)
        eos = getattr(self.tokenizer, "eos_token_id", None) if self.tokenizer else self.config.eos_token_id
        self.eos_id: int | None = eos if isinstance(eos, int) and 0 <= eos < self.vocab_size else None
        self.strips_leading_space = _strips_leading_space(self.tokenizer, self.token_bytes)

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return list(text.encode("utf-8"))
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def tokenize(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        if self.tokenizer is None:
            return self.encode(text)
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def detokenize(self, token_ids: Sequence[int]) -> str | None:
        """The tokenizer's decode (special tokens shown); None without a tokenizer (the tokens are bytes)."""
        return None if self.tokenizer is None else str(self.tokenizer.decode(list(token_ids)))

    def chat_prompt(
        self, turns: Sequence[ChatTurn], tools: Sequence[Tool] = (), *, add_generation_prompt: bool = True
    ) -> list[int]:
        """The tokenizer's own chat template when it has one (Llama, Qwen2, ...), else the default. A
        template that does not read tools gets them as the default's system turn."""
        template = getattr(self.tokenizer, "chat_template", None) if self.tokenizer is not None else None
        if not template:
            text = default_chat_text(default_turns(turns, tools))
            return self.encode(text if add_generation_prompt else text.removesuffix(GENERATION_PROMPT))
        takes_tools = "tools" in str(template)
        if tools and not takes_tools:
            turns = [default_tools_turn(tools), *turns]
        messages = hf_messages(turns)
        ids: Any = self.tokenizer.apply_chat_template(
            messages,
            tools=openai_functions(tools) if tools and takes_tools else None,
            tokenize=True,
            add_generation_prompt=add_generation_prompt,
        )
        if not isinstance(ids, list):  # a BatchEncoding where the tokenizer is set to return dicts
            ids = ids["input_ids"]
        return [int(token) for token in ids]

    def descriptor(
        self,
        name: str,
        *,
        max_sequences: int,
        device: torch.device,
        engine: str,
        dtype: str,
        quantization: str,
    ) -> ModelDescriptor:
        weights = f"torch.{dtype}" + ("" if quantization == "none" else f", {quantization} weights")
        return ModelDescriptor(
            name=name,
            version=str(getattr(self.config, "_name_or_path", "") or self.path.name),
            kind=ModelKind.GENERATIVE,
            description=f"Hugging Face {self.config.model_type} from {self.path} ({engine}, {weights})",
            limits=ModelLimits(
                max_batch_size=max_sequences,
                context_length=self.context_length,
                max_tokens=self.context_length - 1,
                max_concurrent_sequences=max_sequences,
            ),
            device=str(device),
            dtype=dtype,
            quantization=quantization,
        )


def _load_tokenizer(path: Path) -> Any:
    """The directory's (or GGUF file's) tokenizer, or None: then token ids are bytes (the vocabulary must
    cover 0-255)."""
    from transformers import AutoTokenizer

    if path.suffix == ".gguf":
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        # The class AutoTokenizer picks for a GGUF file, without its full parse of the file to pick the class
        # from the config (15 of SmolLM2's 17 s on a loaded 2-core machine); the tokenizer is the same one.
        return TokenizersBackend.from_pretrained(path.parent, gguf_file=path.name)
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
    byte_level = _is_byte_level(tokenizer)
    special = set(tokenizer.all_special_ids)
    table = []
    for token_id, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(vocab_size)))):
        if piece is None or token_id in special:
            table.append(b"")
        elif byte_level:  # GPT-2, Llama 3, Qwen2: every byte is mapped to a printable character
            table.append(bytes(byte_decoder[ch] for ch in piece if ch in byte_decoder))
        elif piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:  # byte fallback
            table.append(bytes((int(piece[3:5], 16),)))
        else:  # SentencePiece: pieces are text, with U+2581 for a space
            table.append(piece.replace("\u2581", " ").encode("utf-8"))
    return table


def _is_byte_level(tokenizer: Any) -> bool:
    """Decided once per tokenizer, from its decoder: a piece's characters alone cannot tell (é is both a
    SentencePiece character and GPT-2's stand-in for byte 0xE9)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        decoder = json.loads(backend.to_str()).get("decoder") or {}
        kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders") or ()}
        return "ByteLevel" in kinds
    return hasattr(tokenizer, "byte_decoder")  # a slow GPT-2-style tokenizer


def _strips_leading_space(tokenizer: Any, table: list[bytes]) -> bool:
    """Whether decode() drops the space that begins the text (SentencePiece's dummy prefix, as in Llama 2 and
    Mistral); byte-level tokenizers (GPT-2, Llama 3, Qwen2) keep it. Asked of the tokenizer itself."""
    if tokenizer is None:
        return False
    for token_id, data in enumerate(table):
        if len(data) > 1 and data.startswith(b" ") and data[1:2] != b" ":
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            return bool(tokenizer.decode([token_id]) == text[1:])
    return False


class HfGenerativeModel(GenerativeModel):
    """What both Hugging Face runtimes take from their checkpoint: the text side and the description."""

    def __init__(
        self,
        checkpoint: HfCheckpoint,
        *,
        name: str,
        max_sequences: int,
        device: torch.device,
        engine: str,
        dtype: torch.dtype,
        quantization: str,
    ) -> None:
        self.checkpoint = checkpoint
        self.device = device
        self.vocab_size = checkpoint.vocab_size
        self.eos_id = checkpoint.eos_id
        self.strips_leading_space = checkpoint.strips_leading_space
        self.context_length = checkpoint.context_length
        self.descriptor = checkpoint.descriptor(
            name, max_sequences=max_sequences, device=device, engine=engine,
            dtype=str(dtype).removeprefix("torch."), quantization=quantization,
        )  # fmt: skip

    def encode(self, text: str) -> list[int]:
        return self.checkpoint.encode(text)

    def chat_prompt(self, turns: Sequence[ChatTurn], tools: Sequence[Tool] = ()) -> list[int]:
        return self.checkpoint.chat_prompt(turns, tools)

    def tokenize(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return self.checkpoint.tokenize(text, add_special_tokens=add_special_tokens)

    def chat_tokens(
        self, turns: Sequence[ChatTurn], tools: Sequence[Tool] = (), *, add_generation_prompt: bool = True
    ) -> list[int]:
        return self.checkpoint.chat_prompt(turns, tools, add_generation_prompt=add_generation_prompt)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        text = self.checkpoint.detokenize(token_ids)
        return super().detokenize(token_ids) if text is None else text

    def token_bytes(self, token_id: int) -> bytes:
        return self.checkpoint.token_bytes[token_id]
