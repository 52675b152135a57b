"""Seeded LoRA adapters built here with `peft` (no hub) over a saved base model, and PEFT's merged model's
greedy generate as the reference the served adapters must equal (issue 32)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

#: (rank, alpha, target modules) of the adapters the tests serve together: ranks 2 to 16, attention only,
#: MLP only, every projection, and q/v alone (PEFT's default for Llama).
SHAPES: list[tuple[int, int, tuple[str, ...]]] = [
    (2, 4, ("q_proj", "v_proj")),
    (4, 16, ("gate_proj", "up_proj", "down_proj")),
    (8, 8, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    (16, 32, ("o_proj", "down_proj")),
]


def base_model(source: Any) -> Any:
    """transformers' model of `source`: a save_pretrained directory, or an already loaded model."""
    import transformers

    if isinstance(source, Path):
        return transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    return source


def save_adapter(
    base: Any, directory: Path, rank: int, alpha: int, targets: Sequence[str], seed: int, scale: float = 0.2
) -> Path:
    """A PEFT LoRA adapter over `base` with seeded, non-zero A and B (PEFT starts B at zero, which would
    adapt nothing), saved with save_pretrained: adapter_config.json + adapter_model.safetensors."""
    import peft

    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0)
    # peft 0.21.2 reads a property transformers 5.23 deprecates, and says what it saves for an lm_head
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        model = peft.get_peft_model(copy.deepcopy(base), config)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
        model.save_pretrained(directory)
    return directory


def merged_greedy(
    base: Any, adapter: Path | None, prompts: Sequence[list[int]], tokens: int, pad: int = 0
) -> list[list[int]]:
    """PEFT's merged model's (or, `adapter` None, the base model's) greedy generate of each prompt; the
    merge is made into a copy of `base`."""
    import peft

    model = base
    if adapter is not None:
        with warnings.catch_warnings():  # as in save_adapter
            warnings.simplefilter("ignore", FutureWarning)
            model = peft.PeftModel.from_pretrained(copy.deepcopy(base), adapter).merge_and_unload()
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = model.generate(
                ids, max_new_tokens=tokens, do_sample=False, pad_token_id=pad, eos_token_id=None
            )
            out.append([int(t) for t in generated[0, ids.shape[1] :]])
    return out
