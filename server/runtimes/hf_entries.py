"""`--hf-models NAME=PATH` entries as registry entries: each is a model named NAME with HfOptions, which
`--model-options NAME.KEY=VALUE` sets as for any registered model (its dtype, which engine runs it, which
GGUF file of a directory); the start-up check of PATH; and the factory that loads it (hf_causal.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from process.flags import setting
from server.runtimes.base import GenerativeModel
from server.runtimes.options import ModelContext

HF_OPTIONS_OF = "HF"  # how --help shows the options every --hf-models entry takes: HF.dtype=...


@dataclass(frozen=True, slots=True, kw_only=True)
class HfOptions:
    """What each --hf-models entry takes in --model-options (NAME.dtype=bfloat16)."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = setting(
        "auto", help="this model's weights and KV dtype (auto: the server's --dtype)"
    )
    engine: Literal["auto", "native", "generic"] = setting(
        "auto",
        help="native: the native decoder (refused where its table has no entry for the checkpoint); "
        "generic: transformers' own forward; auto: native where it can",
    )
    gguf: str = setting("", help="the GGUF file to serve, where the entry's directory holds several")
    quantization: Literal["auto", "none", "int8", "int4", "w8a8_int8"] = setting(
        "auto", help="this model's weight-only quantization (auto: the server's --quantization)"
    )

    def __post_init__(self) -> None:
        if self.gguf and (os.sep in self.gguf or not self.gguf.endswith(".gguf")):
            raise ValueError(f"gguf takes a .gguf file name in the entry's directory, not {self.gguf!r}")


def hf_path(path: Path, options: HfOptions) -> Path:
    """What the entry serves: its path, or the GGUF file `options.gguf` names in it."""
    return path / options.gguf if options.gguf else path


def check_hf_entry(name: str, path: Path, options: HfOptions) -> None:
    """Raises ValueError unless the entry's path can be served: a GGUF file the loader reads, or a
    save_pretrained directory (it holds config.json)."""
    from server.runtimes.gguf_file import check_gguf, gguf_file

    path = hf_path(path, options)
    try:
        found = gguf_file(path)
        if found is not None:
            check_gguf(found)
    except (OSError, ValueError, ImportError) as exc:  # ImportError: the gguf package is not installed
        raise ValueError(f"invalid setting hf_models: {name}={path}: {exc}") from exc
    if found is None and not os.access(path / "config.json", os.R_OK):
        raise ValueError(
            f"invalid setting hf_models: {name}={path} needs a readable directory saved with "
            "save_pretrained (it holds config.json), or a .gguf file"
        )
    if options.engine == "native":
        _check_native(name, found or path)


def _check_native(name: str, path: Path) -> None:
    """engine=native on a checkpoint the native decoder's table cannot run is refused before binding."""
    from server.runtimes.gguf_file import read_config
    from server.runtimes.llama import unsupported

    if path.suffix == ".gguf":
        config = read_config(path)
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
    reason = unsupported(config, path)
    if reason is not None:
        raise ValueError(
            f"invalid setting model_options: {name}.engine=native: {path} cannot be served natively: {reason}"
        )


def hf_factory(name: str, path: Path) -> Callable[[Any, ModelContext], GenerativeModel]:
    """The registry's factory of the entry NAME=PATH: it takes (HfOptions, ModelContext)."""

    def build(options: HfOptions, context: ModelContext) -> GenerativeModel:
        from server.runtimes.hf_causal import load_hf_causal  # transformers loads only when a model needs it

        return load_hf_causal(
            hf_path(path, options),
            name=name,
            context_length=context.context_length,
            max_sequences=context.max_sequences,
            device=context.device,
            dtype=model_dtype(context.dtype if options.dtype == "auto" else options.dtype, context.device),
            engine=options.engine,
            quantization=model_quantization(options.quantization, context),
        )

    return build


def model_quantization(setting: str, context: ModelContext) -> str:
    """NAME.quantization: auto is the server's --quantization."""
    return context.quantization if setting == "auto" else setting


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_dtype(setting: str, device: torch.device) -> torch.dtype:
    """--dtype: auto is bfloat16 on CUDA (half the memory, tensor cores) and float32 on CPU, where bfloat16
    matmuls are slower on most of the CPUs these machines have."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[setting]
