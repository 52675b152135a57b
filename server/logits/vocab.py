"""The grammar engine's view of a model's vocabulary: llguidance's LLTokenizer built from the bytes each
token stands for (the same table the scheduler detokenises with), so byte vocabularies and Hugging Face
tokenizers are one case. Built once per model, off the event loop (a 128k vocabulary takes ~100 ms)."""

from __future__ import annotations

import threading
from typing import Any

import llguidance

from server.runtimes.base import GenerativeModel


class _Vocabulary(llguidance.TokenizerWrapper):
    """What LLTokenizer reads: every token's bytes, EOS, the special tokens and an encoder for forced text."""

    def __init__(self, model: GenerativeModel) -> None:
        assert model.eos_id is not None
        self.eos_token_id = model.eos_id
        self.bos_token_id = None
        self.tokens = [model.token_bytes(i) for i in range(model.vocab_size)]
        self.special_token_ids = [i for i, data in enumerate(self.tokens) if not data]
        self.is_tokenizer_wrapper = True
        self._model = model
        self._accepts_bytes = True

    def _encode_string(self, s: Any) -> list[int]:
        text = s.decode("utf-8", "replace") if isinstance(s, bytes) else s
        return self._model.encode(text)

    __call__ = _encode_string


_lock = threading.Lock()
_built: dict[int, tuple[GenerativeModel, llguidance.LLTokenizer]] = {}


def grammar_tokenizer(model: GenerativeModel) -> llguidance.LLTokenizer:
    """The model's LLTokenizer, built on first use (call it off the event loop)."""
    with _lock:
        entry = _built.get(id(model))
        if entry is None or entry[0] is not model:
            tokenizer = llguidance.LLTokenizer(_Vocabulary(model), n_vocab=model.vocab_size)
            entry = _built[id(model)] = (model, tokenizer)
        return entry[1]
