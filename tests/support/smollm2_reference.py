"""transformers' own SmolLM2 model and tokenizer from the GGUF file the embedded model serves, in float32:
the reference the SmolLM2 suites compare against, built once per test run and shared by its modules.

Why a cache: transformers dequantizes the file in ~18 CPU-s and reads its tokenizer in ~6 (loaded, 2-core
EPYC); two modules build the reference (test_smollm2, test_lora_smollm2). The first module to ask writes
what it built (the state dict, the config without its GGUF quantization entry, the tokenizer) under the
run's base temporary directory, which every xdist worker of the run shares; the others read it back in
~2 CPU-s, the same weights and tokenizer (their logits equal the built model's bit for bit). A lock makes a
module that asks while another builds wait for that build instead of repeating it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from server.runtimes.smollm2 import smollm2_gguf
from tests.support.threads import one_thread

WEIGHTS = "weights.pt"


def _shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's directory above each xdist worker's own (popen-gwN); the base itself without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if base.name.startswith("popen-gw") else base


def _build(folder: Path) -> tuple[Any, Any]:
    import torch
    import transformers

    path = smollm2_gguf()
    source: dict[str, Any] = {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name}
    tokenizer = transformers.AutoTokenizer.from_pretrained(**source)
    model = transformers.AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32).eval()
    # A GGUF-loaded model refuses save_pretrained; its float32 weights and its config (without the entry
    # that says they came from GGUF) rebuild the same model. torch.save keeps the tied lm_head one tensor.
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # what a build that failed half-way left
    partial.mkdir()
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    type(model.config).from_dict(config).save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    torch.save(model.state_dict(), partial / WEIGHTS)
    partial.rename(folder)  # whole or absent: a reader never sees half of it
    return tokenizer, model


def _read(folder: Path) -> tuple[Any, Any]:
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    config = transformers.AutoConfig.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(torch.load(folder / WEIGHTS, weights_only=True))
    return tokenizer, model.eval()


def smollm2_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """(tokenizer, float32 model) as transformers loads them from the GGUF file, built once per run."""
    from filelock import FileLock

    root = _shared_root(tmp_path_factory)
    folder = root / "smollm2-reference"
    with FileLock(str(root / "smollm2-reference.lock")), one_thread():
        return _read(folder) if folder.is_dir() else _build(folder)
