"""The model factory of Sluice 0.1.0, `factory(settings, device)`, kept working until 0.3.0 drops it: how the
registry tells it from a ModelContext factory, the deprecation it warns with, and the settings it is given.

0.1.0's README registered plugins as `register_model("m", lambda settings, device: Model(device))`, and its
factories read server settings (`settings.max_batch_size`, `settings.mlp_width`). Refusing them stopped
servers that only needed a new release; as with --lm-size and --mlp-width, the former form runs with a
warning that names the new one.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from server.former_flags import FORMER_FLAGS

DROPPED_IN = "0.3.0"  # two minor releases after the form was replaced (0.2.0), as a flag's deprecation runs


def is_former(factory: Callable[..., Any]) -> bool:
    """Whether `factory` is of the former form: it cannot be called with one argument (a ModelContext) but
    can with two ((settings, device)). A callable without a readable signature is taken as documented."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return False
    return not _binds(signature, 1) and _binds(signature, 2)


def deprecation(name: str) -> str:
    """What a former factory is warned with: the model, the new form, and the release that drops the old."""
    return (
        f"register_model({name!r}): a factory taking (settings, device) is deprecated and will stop working "
        f"in Sluice {DROPPED_IN}; take a ModelContext instead (lambda context: Model(context.device); it "
        "also has max_batch_size, context_length and max_sequences) and declare the model's own settings "
        "with register_model(..., options=...)"
    )


def warn(name: str) -> None:
    """A DeprecationWarning attributed to the plugin's register_model() line (this, register_model, the
    plugin), so `python -W error::DeprecationWarning` and pytest point at the line to change."""
    warnings.warn(deprecation(name), DeprecationWarning, stacklevel=3)


class FormerSettings:
    """The server's Settings as a former factory reads them: every field, read-only, and the fields that
    became model options (lm_size, mlp_width) read from those options, as --lm-size and --mlp-width set
    them still."""

    __slots__ = ("_options", "_settings")

    def __init__(self, settings: object, options: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_settings", settings)
        object.__setattr__(self, "_options", options)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in FORMER_FLAGS:
            model, _, key = FORMER_FLAGS[name].rpartition(".")
            return getattr(self._options[model], key)
        return getattr(self._settings, name)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"the server's settings are read-only: {name}")


def _binds(signature: inspect.Signature, count: int) -> bool:
    try:
        signature.bind(*([None] * count))
    except TypeError:
        return False
    return True
