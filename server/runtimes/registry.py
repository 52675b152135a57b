"""The model registry: factories by name, so `--models` picks what to load and plugins add their own, each
with the options its model declares (`--model-options NAME.KEY=VALUE`).

A plugin module (loaded with `--plugins my_pkg.models`, a module on the working directory, or a .py path)
calls `register_model("name", factory)`, where the factory takes a ModelContext (the device and the server's
limits), or `register_model("name", factory, options=NameOptions)`, where it takes (NameOptions,
ModelContext), and returns a TensorModel or GenerativeModel. A factory of 0.1.0's (settings, device) form
still registers, with a DeprecationWarning, until 0.3.0 (server/runtimes/former_factory.py). check_models()
finds every mistake in these settings, the model options included, before the server binds.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

import torch

from server.model_selection import model_option_entries
from server.runtimes import former_factory
from server.runtimes.base import GenerativeModel, TensorModel
from server.runtimes.byte_lm import ByteLmOptions, byte_lm
from server.runtimes.encoder import all_minilm_l6_v2
from server.runtimes.former_factory import FormerSettings
from server.runtimes.mlp import MlpOptions, mlp_model
from server.runtimes.options import (
    ModelContext,
    ModelSettings,
    NoOptions,
    check_declaration,
    describe_options,
    parse_options,
)
from server.runtimes.smollm2 import smollm2_model

Model = TensorModel | GenerativeModel
OptionsT = TypeVar("OptionsT")
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Registration:
    build: Callable[[Any, ModelContext], Model]
    options: type[Any]
    options_of: str  # whose --model-options entries configure this model: its own, or the model it varies
    former: bool = False  # a (settings, device) factory: built with FormerSettings in place of options


_REGISTRY: dict[str, _Registration] = {}


@overload
def register_model(name: str, factory: Callable[[ModelContext], Model]) -> None: ...
@overload
def register_model(
    name: str, factory: Callable[[OptionsT, ModelContext], Model], *, options: type[OptionsT]
) -> None: ...
@overload
def register_model(name: str, factory: Callable[[Any, ModelContext], Model], *, options_of: str) -> None: ...
def register_model(
    name: str,
    factory: Callable[..., Model],
    *,
    options: type[Any] | None = None,
    options_of: str | None = None,
) -> None:
    """Makes `name` loadable with `--models name`; a later registration replaces an earlier one.

    With `options` (a frozen dataclass of `setting` fields) the factory takes (those options, ModelContext)
    and `--model-options name.KEY=VALUE` sets them; with `options_of` it is a variant of that registered model
    and takes its options, as that model's --model-options entries set them.
    """
    if options is not None and options_of is not None:
        raise TypeError(f"register_model({name!r}): give options or options_of, not both")
    if options is None and options_of is None and former_factory.is_former(factory):
        former_factory.warn(name)
        _REGISTRY[name] = _Registration(
            lambda given, context: factory(given, context.device), NoOptions, name, True
        )
        return
    _check_arity(name, factory, with_options=options is not None or options_of is not None)
    if options_of is not None:
        if options_of not in _REGISTRY:
            raise ValueError(f"register_model({name!r}): options_of={options_of!r} is not a registered model")
        base = _REGISTRY[options_of]
        _REGISTRY[name] = _Registration(factory, base.options, base.options_of)
    elif options is not None:
        check_declaration(name, options)
        _REGISTRY[name] = _Registration(factory, options, name)
    else:
        _REGISTRY[name] = _Registration(lambda _none, context: factory(context), NoOptions, name)


def _check_arity(name: str, factory: Callable[..., Model], *, with_options: bool) -> None:
    """A factory that cannot be called as it will be is refused when its plugin is imported, not once the
    server listens."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # a callable without a signature to read: it is called as documented
    try:
        signature.bind(*([None, None] if with_options else [None]))
    except TypeError:
        takes = "(its options, a ModelContext)" if with_options else "a ModelContext"
        raise TypeError(
            f"register_model({name!r}): the factory must take {takes} (context.device, "
            f"context.max_batch_size, ...), not {signature}; declare options= for the model's own settings"
        ) from None


register_model("mlp", mlp_model, options=MlpOptions)
register_model("byte-lm", byte_lm, options=ByteLmOptions)
register_model(
    "all-minilm-l6-v2",
    lambda context: all_minilm_l6_v2(max_batch_size=context.max_batch_size, device=context.device),
)
register_model("smollm2", smollm2_model)


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


def check_models(settings: ModelSettings) -> None:
    """Imports the plugins and checks every model setting; raises ValueError naming the setting and the fix.
    Runs before the server binds its port, so a mistake never leaves a half-started server."""
    load_plugins(settings.plugins)
    hf = settings.hf_directories
    known = sorted({*_REGISTRY, *hf})
    unknown = [name for name in settings.served_models if name not in known]
    if unknown:
        raise ValueError(
            f"invalid setting models: unknown {', '.join(unknown)}; known: {', '.join(known)} "
            "(a plugin given with --plugins, or --hf-models NAME=DIR, can add more)"
        )
    for name, directory in hf.items():
        if _checked_gguf(name, Path(directory)):
            continue
        if not os.access(Path(directory) / "config.json", os.R_OK):
            raise ValueError(
                f"invalid setting hf_models: {name}={directory} needs a readable directory saved with "
                "save_pretrained (it holds config.json), or a .gguf file"
            )
    model_options(settings)


def _checked_gguf(name: str, path: Path) -> bool:
    """Whether --hf-models NAME=PATH names a GGUF file that can be served; ValueError where it cannot."""
    from server.runtimes.gguf_file import check_gguf, gguf_file

    try:
        found = gguf_file(path)
        if found is not None:
            check_gguf(found)
    except (OSError, ValueError, ImportError) as exc:  # ImportError: the gguf package is not installed
        raise ValueError(f"invalid setting hf_models: {name}={path}: {exc}") from exc
    return found is not None


def model_options(settings: ModelSettings) -> dict[str, Any]:
    """The options of every registered model that declares its own, by name, from --model-options (a later
    entry for the same key wins); raises ValueError naming the entry and what it takes. After load_plugins."""
    given = model_option_entries(settings.model_options)
    hf = settings.hf_directories
    for name, keys in given.items():
        first = f"--model-options {name}.{next(iter(keys))}"
        if name not in _REGISTRY:
            declared = [n for n in _owners() if _REGISTRY[n].options is not NoOptions]
            what = "a --hf-models model, takes no options" if name in hf else "is not a registered model"
            raise ValueError(
                f"invalid setting model_options: {first}: {name} {what}; models with options: "
                f"{', '.join(declared)} (a plugin given with --plugins can add more)"
            )
        if _REGISTRY[name].options_of != name:
            base = _REGISTRY[name].options_of
            raise ValueError(
                f"invalid setting model_options: {first}: {name} takes the options of {base}; give "
                f"{base}.{next(iter(keys))}"
            )
    try:
        return {name: parse_options(name, _REGISTRY[name].options, given.get(name, {})) for name in _owners()}
    except ValueError as exc:
        raise ValueError(f"invalid setting model_options: {exc}") from exc


def options_help() -> str:
    """Every registered model's options, one a line, for `sluice serve --help`."""
    rows = [row for name in _owners() for row in describe_options(name, _REGISTRY[name].options)]
    width = max((len(given) for given, _ in rows), default=0)
    lines = [f"  {given:<{width}}  {text}" for given, text in rows]
    title = "model options (--model-options NAME.KEY=VALUE; a plugin given with --plugins may declare more):"
    return "\n".join([title, *lines])


def log_deprecations() -> None:
    """Logs, once the server's logging is set up, what each plugin registered in a deprecated form (python
    hides a DeprecationWarning raised outside __main__ unless -W asks)."""
    for name, registration in sorted(_REGISTRY.items()):
        if registration.former:
            log.warning("%s", former_factory.deprecation(name))


def _owners() -> list[str]:
    """The registered models that own their options (every one but the variants), by name."""
    return sorted(name for name, registration in _REGISTRY.items() if registration.options_of == name)


def build_models(settings: ModelSettings, device: torch.device) -> list[Model]:
    """Builds every served model, in --models order (after check_models; call on the model's thread). A name
    given in --hf-models is that Hugging Face model, even where an embedded model has the same name."""
    hf = settings.hf_directories
    options = model_options(settings)
    context = ModelContext(
        device=device,
        max_batch_size=settings.max_batch_size,
        context_length=settings.context_length,
        max_sequences=settings.max_sequences,
        dtype=settings.dtype,
    )
    models = []
    for name in settings.served_models:
        if name in hf:
            models.append(_hf_model(settings, name, Path(hf[name]), device))
        else:
            registration = _REGISTRY[name]
            given = (
                FormerSettings(settings, options) if registration.former else options[registration.options_of]
            )
            models.append(registration.build(given, context))
    return models


def _hf_model(settings: ModelSettings, name: str, directory: Path, device: torch.device) -> Model:
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
