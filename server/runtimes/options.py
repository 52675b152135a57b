"""What a model factory is given: the options its model declares, parsed from `--model-options
NAME.KEY=VALUE`, and the ModelContext every model is built under (its device and the limits the server
enforces); and ModelSettings, what the registry reads of the server's Settings (which it never imports: the
server's command line lists the registered models' options, so the registry is below the settings).

A model's options are a frozen dataclass whose fields are made with `setting(default, help=..., unit=...)`
(process/flags.py, as the server's own Settings): the field's type says how a value parses (int, float, str,
bool, or a Literal of the allowed strings), and a `__post_init__` may raise ValueError for the rest.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from process.flags import help_text

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")  # as the server's own flags read


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelContext:
    """The server-wide settings a model is built under; a factory gets these, never the server's Settings."""

    device: torch.device
    max_batch_size: int  # items per Infer forward pass
    context_length: int  # longest sequence of a generative model; 0: the model's own
    max_sequences: int  # sequences a generative model runs at once
    dtype: str = "auto"  # --dtype: auto, float32, bfloat16 or float16 (auto: bfloat16 on CUDA, else float32)
    quantization: str = "none"  # --quantization: none, int8 or int4 (weight-only, docs/quantization.md)


class ModelSettings(Protocol):
    """The server settings the registry builds models from (server/config.py's Settings has them all)."""

    @property
    def plugins(self) -> tuple[str, ...]: ...
    @property
    def model_options(self) -> tuple[str, ...]: ...
    @property
    def hf_directories(self) -> dict[str, str]: ...
    @property
    def served_models(self) -> tuple[str, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def quantization(self) -> str: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def context_length(self) -> int: ...
    @property
    def max_sequences(self) -> int: ...


@dataclass(frozen=True, slots=True)
class NoOptions:
    """The options of a model that declares none."""


def parse_options(name: str, options_type: type[Any], given: Mapping[str, str]) -> Any:
    """`options_type` built from KEY -> VALUE texts (the rest keep their defaults); raises ValueError naming
    `--model-options NAME.KEY` and what it takes."""
    fields = {field.name: field for field in dataclasses.fields(options_type)}
    hints = typing.get_type_hints(options_type)
    values: dict[str, Any] = {}
    for key, text in given.items():
        if not fields:
            raise ValueError(f"--model-options {name}.{key}: {name} takes no options")
        if key not in fields:
            keys = ", ".join(fields)
            raise ValueError(f"--model-options {name}.{key}: {name} has no option {key} (it has: {keys})")
        values[key] = _parse_value(f"{name}.{key}", hints[key], text)
    try:
        return options_type(**values)
    except ValueError as exc:
        shown = ",".join(f"{name}.{key}={text}" for key, text in given.items())
        raise ValueError(f"--model-options {shown}: {exc}") from exc


def describe_options(name: str, options_type: type[Any]) -> list[tuple[str, str]]:
    """Each option as given and what it does: (`mlp.width=N`, `hidden width ... (units; default: 2048)`)."""
    hints = typing.get_type_hints(options_type)
    return [
        # help_text doubles a percent sign for argparse's %-formatting of flag help; this is not a flag's.
        (f"{name}.{field.name}={_metavar(hints[field.name])}", help_text(field).replace("%%", "%"))
        for field in dataclasses.fields(options_type)
    ]


def check_declaration(name: str, options_type: type[Any]) -> None:
    """Raises TypeError where `options_type` cannot be the options of model `name`: not a dataclass, a field
    without a default, or a type no option value parses into."""
    if not dataclasses.is_dataclass(options_type) or not isinstance(options_type, type):
        raise TypeError(f"the options of {name} must be a dataclass, not {options_type!r}")
    hints = typing.get_type_hints(options_type)
    for field in dataclasses.fields(options_type):
        kind = hints[field.name]
        if typing.get_origin(kind) is not Literal and kind not in (int, float, str, bool):
            raise TypeError(
                f"option {name}.{field.name} is a {kind!r}: declare int, float, str, bool or a Literal"
            )
    try:
        options_type()
    except TypeError as exc:
        raise TypeError(f"every option of {name} needs a default ({exc})") from exc


def _parse_value(option: str, kind: Any, text: str) -> Any:
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        if text not in choices:
            raise ValueError(f"--model-options {option} takes {_either(choices)}, not {text!r}")
        return text
    if kind is bool:
        if text.strip().lower() not in (*_TRUE, *_FALSE):
            raise ValueError(f"--model-options {option} takes true or false, not {text!r}")
        return text.strip().lower() in _TRUE
    if kind is str:
        return text
    try:
        return kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"--model-options {option} takes {what}, not {text!r}") from None


def _metavar(kind: Any) -> str:
    if typing.get_origin(kind) is Literal:
        return "|".join(map(str, typing.get_args(kind)))
    return {int: "N", float: "X", bool: "BOOL"}.get(kind, "TEXT")


def _either(choices: tuple[Any, ...]) -> str:
    words = [str(choice) for choice in choices]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
