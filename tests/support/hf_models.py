"""Seeded Hugging Face causal LMs built from small configs and saved with save_pretrained, for the tests
of both HF runtimes: Llama, Mistral (a sliding window shorter than the tests' sequences), Qwen2 (q/k/v
biases) and GPT-2 (the generic path). Byte vocabularies (no tokenizer): token ids are bytes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

VOCAB = 300
EOS = 256


def configs() -> dict[str, Any]:
    import transformers

    # A wide initialisation keeps the logits well apart, so greedy choices do not hang on rounding.
    common: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "initializer_range": 0.3,
        "eos_token_id": EOS,
        "bos_token_id": 257,
    }
    return {
        "llama": transformers.LlamaConfig(**common),
        "mistral": transformers.MistralConfig(**common, sliding_window=16),
        "qwen2": transformers.Qwen2Config(**common),
        "gpt2": transformers.GPT2Config(
            vocab_size=VOCAB,
            n_positions=256,
            n_embd=64,
            n_layer=2,
            n_head=4,
            initializer_range=0.3,
            eos_token_id=EOS,
            bos_token_id=257,
        ),
    }


def save(kind: str, directory: Path) -> Path:
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(configs()[kind]).eval()
    model.save_pretrained(directory)
    return directory


def greedy_reference(
    directory: Path, prompt: list[int], tokens: int, *, repetition_penalty: float = 1.0
) -> list[int]:
    """transformers' own greedy generate, the sequence alone; EOS is a token like any other (ignore_eos);
    `repetition_penalty` as its RepetitionPenaltyLogitsProcessor applies it."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            max_new_tokens=tokens,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
            repetition_penalty=repetition_penalty,
        )
    return [int(t) for t in out[0, ids.shape[1] :]]


def save_with_tokenizer(
    directory: Path, *, template: str | None = None, added_tokens: Sequence[str] = (), **config: Any
) -> Path:
    """A seeded tiny Llama with a byte-level BPE tokenizer trained here (its EOS `</s>`), and a chat
    template where one is given: the Hugging Face tokenizer path, unlike the byte vocabularies above.
    `added_tokens` become tokens of their own (not special: they stand for their text)."""
    import tokenizers
    import transformers

    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(["hello there, you are terse", "[system] [user] [assistant]"] * 20, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>")
    tokenizer.add_tokens(list(added_tokens))
    if template is not None:
        tokenizer.chat_template = template
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    settings: dict[str, Any] = {
        "vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 128,
        "eos_token_id": tokenizer.eos_token_id, **config,
    }  # fmt: skip
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings)).save_pretrained(directory)
    return directory
