"""The model registry: factories by name, so `--models` picks what to load and plugins add their own.

A plugin module (loaded with `--plugins my_pkg.models`) calls `register_model("name", factory)`, where the
factory takes (Settings, torch.device) and returns a TensorModel or GenerativeModel.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import torch

from server.config import Settings
from server.runtimes.base import GenerativeModel, TensorModel
from server.runtimes.byte_lm import ByteLm
from server.runtimes.mlp import MlpModel

Model = TensorModel | GenerativeModel
ModelFactory = Callable[[Settings, torch.device], Model]

_FACTORIES: dict[str, ModelFactory] = {
    "mlp": lambda s, device: MlpModel(width=s.mlp_width, max_batch_size=s.max_batch_size, device=device),
    "byte-lm": lambda s, device: ByteLm(
        size=s.lm_size, context_length=s.context_length, max_sequences=s.max_sequences, device=device
    ),
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


def build_models(settings: Settings, device: torch.device) -> list[Model]:
    """Imports plugins, then builds every model named in settings.models (call on the model's thread)."""
    for module in settings.plugins:
        importlib.import_module(module)
    unknown = [name for name in settings.models if name not in _FACTORIES]
    if unknown:
        raise ValueError(f"invalid setting models: unknown {unknown}; known: {sorted(_FACTORIES)}")
    models = [_FACTORIES[name](settings, device) for name in settings.models]
    for spec in settings.hf_models:
        name, _, directory = spec.partition("=")
        if not Path(directory).is_dir():
            raise ValueError(f"invalid setting hf_models: {directory!r} is not a directory")
        from server.runtimes.hf_causal import HfCausalLm

        models.append(
            HfCausalLm(
                Path(directory),
                name=name,
                context_length=settings.context_length,
                max_sequences=settings.max_sequences,
                device=device,
            )
        )
    return models
