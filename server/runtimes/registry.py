"""The model registry: factories by name, so `--models` picks what to load and plugins add their own.

A plugin module (loaded with `--plugins my_pkg.models`, a module on the working directory, or a .py path)
calls `register_model("name", factory)`, where the factory takes (Settings, torch.device) and returns a
TensorModel or GenerativeModel. check_models() finds every mistake in these settings before the server binds.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from server.config import Settings
from server.runtimes.base import GenerativeModel, TensorModel
from server.runtimes.byte_lm import ByteLm
from server.runtimes.encoder import all_minilm_l6_v2
from server.runtimes.mlp import MlpModel

Model = TensorModel | GenerativeModel
ModelFactory = Callable[[Settings, torch.device], Model]

_FACTORIES: dict[str, ModelFactory] = {
    "mlp": lambda s, device: MlpModel(width=s.mlp_width, max_batch_size=s.max_batch_size, device=device),
    "byte-lm": lambda s, device: ByteLm(
        size=s.lm_size, context_length=s.context_length, max_sequences=s.max_sequences, device=device
    ),
    "all-minilm-l6-v2": lambda s, device: all_minilm_l6_v2(max_batch_size=s.max_batch_size, device=device),
}


def register_model(name: str, factory: ModelFactory) -> None:
    """Makes `name` loadable with `--models name`; a later registration replaces an earlier one."""
    _FACTORIES[name] = factory


def resolve_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(setting)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"invalid setting device: {setting} requested but torch sees no CUDA device")
    return device


def load_plugins(plugins: Sequence[str]) -> None:
    """Imports each plugin: a module name, found on the working directory too (as `uvicorn --app-dir .`),
    or the path of a .py file."""
    for plugin in plugins:
        try:
            if plugin.endswith(".py") or os.sep in plugin:
                _import_file(Path(plugin))
            else:
                if os.getcwd() not in sys.path:
                    sys.path.insert(0, os.getcwd())
                importlib.import_module(plugin)
        except Exception as exc:  # whatever the plugin raised, the setting is what the user must fix
            raise ValueError(
                f"invalid setting plugins: importing {plugin!r} failed ({type(exc).__name__}: {exc}); give a "
                "module importable from the working directory or the path of a .py file"
            ) from exc


def _import_file(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    spec = importlib.util.spec_from_file_location(path.stem, path.resolve())
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)


def check_models(settings: Settings) -> None:
    """Imports the plugins and checks every model setting; raises ValueError naming the setting and the fix.
    Runs before the server binds its port, so a mistake never leaves a half-started server."""
    load_plugins(settings.plugins)
    hf = settings.hf_directories
    known = sorted({*_FACTORIES, *hf})
    unknown = [name for name in settings.served_models if name not in known]
    if unknown:
        raise ValueError(
            f"invalid setting models: unknown {', '.join(unknown)}; known: {', '.join(known)} "
            "(a plugin given with --plugins, or --hf-models NAME=DIR, can add more)"
        )
    for name, directory in hf.items():
        if not os.access(Path(directory) / "config.json", os.R_OK):
            raise ValueError(
                f"invalid setting hf_models: {name}={directory} needs a readable directory saved with "
                "save_pretrained (it holds config.json)"
            )


def build_models(settings: Settings, device: torch.device) -> list[Model]:
    """Builds every served model, in --models order (after check_models; call on the model's thread). A name
    given in --hf-models is that Hugging Face model, even where an embedded model has the same name."""
    hf = settings.hf_directories
    return [
        _hf_model(settings, name, Path(hf[name]), device)
        if name in hf
        else _FACTORIES[name](settings, device)
        for name in settings.served_models
    ]


def _hf_model(settings: Settings, name: str, directory: Path, device: torch.device) -> Model:
    from server.runtimes.hf_causal import load_hf_causal  # transformers loads only when a model needs it

    return load_hf_causal(
        directory,
        name=name,
        context_length=settings.context_length,
        max_sequences=settings.max_sequences,
        device=device,
        dtype=model_dtype(settings.dtype, device),
    )


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_dtype(setting: str, device: torch.device) -> torch.dtype:
    """--dtype: auto is bfloat16 on CUDA (half the memory, tensor cores) and float32 on CPU, where bfloat16
    matmuls are slower on most of the CPUs these machines have."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[setting]
