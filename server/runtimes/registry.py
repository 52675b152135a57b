"""The model registry: factories by name, so `--models` picks what to load and plugins add their own, each
with the options its model declares (`--model-options NAME.KEY=VALUE`).

A plugin module (loaded with `--plugins my_pkg.models`, a module on the working directory, or a .py path)
calls `register_model("name", factory)`, where the factory takes a ModelContext (the device and the server's
limits), or `register_model("name", factory, options=NameOptions)`, where it takes (NameOptions,
ModelContext), and returns a TensorModel or GenerativeModel. A factory of 0.1.0's (settings, device) form
still registers, with a DeprecationWarning, until 0.3.0 (server/runtimes/former_factory.py). Each
`--hf-models NAME=PATH` entry is one more registration, with HfOptions (hf_entries.py). check_models() finds
every mistake in these settings, the model options included, before the server binds.
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
from server.runtimes.hf_entries import HF_OPTIONS_OF, HfOptions, check_hf_entry, hf_factory
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
    known = sorted(_registrations(settings))
    unknown = [name for name in settings.served_models if name not in known]
    if unknown:
        raise ValueError(
            f"invalid setting models: unknown {', '.join(unknown)}; known: {', '.join(known)} "
            "(a plugin given with --plugins, or --hf-models NAME=DIR, can add more)"
        )
    options = model_options(settings)
    for name, directory in settings.hf_directories.items():
        check_hf_entry(name, Path(directory), options[name])


def _registrations(settings: ModelSettings) -> dict[str, _Registration]:
    """Every registered model and each --hf-models entry, which replaces a registration of the same name."""
    hf = settings.hf_directories
    entries = {
        name: _Registration(hf_factory(name, Path(path)), HfOptions, name) for name, path in hf.items()
    }
    return {**_REGISTRY, **entries}


def model_options(settings: ModelSettings) -> dict[str, Any]:
    """The options of every registered model that declares its own, by name, from --model-options (a later
    entry for the same key wins); raises ValueError naming the entry and what it takes. After load_plugins."""
    given = model_option_entries(settings.model_options)
    registry = _registrations(settings)
    for name, keys in given.items():
        first = f"--model-options {name}.{next(iter(keys))}"
        if name not in registry:
            declared = [n for n in _owners(registry) if registry[n].options is not NoOptions]
            raise ValueError(
                f"invalid setting model_options: {first}: {name} is not a registered model; models with "
                f"options: {', '.join(declared)} (a plugin given with --plugins can add more)"
            )
        if registry[name].options_of != name:
            base = registry[name].options_of
            raise ValueError(
                f"invalid setting model_options: {first}: {name} takes the options of {base}; give "
                f"{base}.{next(iter(keys))}"
            )
    try:
        return {
            name: parse_options(name, registry[name].options, given.get(name, {}))
            for name in _owners(registry)
        }
    except ValueError as exc:
        raise ValueError(f"invalid setting model_options: {exc}") from exc


def options_help() -> str:
    """Every registered model's options, one a line, for `sluice serve --help`."""
    rows = [row for name in _owners(_REGISTRY) for row in describe_options(name, _REGISTRY[name].options)]
    title = "model options (--model-options NAME.KEY=VALUE; a plugin given with --plugins may declare more):"
    hf_title = f"each --hf-models entry NAME takes ({HF_OPTIONS_OF} standing for NAME):"
    hf_rows = describe_options(HF_OPTIONS_OF, HfOptions)
    return "\n".join([title, *_aligned(rows), hf_title, *_aligned(hf_rows)])


def _aligned(rows: list[tuple[str, str]]) -> list[str]:
    width = max((len(given) for given, _ in rows), default=0)
    return [f"  {given:<{width}}  {text}" for given, text in rows]


def log_deprecations() -> None:
    """Logs, once the server's logging is set up, what each plugin registered in a deprecated form (python
    hides a DeprecationWarning raised outside __main__ unless -W asks)."""
    for name, registration in sorted(_REGISTRY.items()):
        if registration.former:
            log.warning("%s", former_factory.deprecation(name))


def _owners(registry: dict[str, _Registration]) -> list[str]:
    """The registered models that own their options (every one but the variants), by name."""
    return sorted(name for name, registration in registry.items() if registration.options_of == name)


def build_models(settings: ModelSettings, device: torch.device) -> list[Model]:
    """Builds every served model, in --models order (after check_models; call on the model's thread). A name
    given in --hf-models is that Hugging Face model, even where an embedded model has the same name."""
    registry = _registrations(settings)
    options = model_options(settings)
    context = ModelContext(
        device=device,
        max_batch_size=settings.max_batch_size,
        context_length=settings.context_length,
        max_sequences=settings.max_sequences,
        dtype=settings.dtype,
        quantization=settings.quantization,
    )
    models = []
    for name in settings.served_models:
        registration = registry[name]
        given = FormerSettings(settings, options) if registration.former else options[registration.options_of]
        models.append(registration.build(given, context))
    return models
