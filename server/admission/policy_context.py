"""What an admission policy is built with, as a model is built with its options and a ModelContext
(server/runtimes/options.py): the settings it declares and the server's objects it may use.

A policy's settings are a frozen dataclass in its own file, a subclass of PolicySettingsBase whose fields are
made with `setting(default, help=..., unit=...)` (process/flags.py): each field is a flag of `sluice serve`
(and `sluice up`) under its own name, because the server's Settings inherits every registered policy's
settings (server/admission/policies/__init__.py). A `__post_init__` that checks its values raises ValueError
("invalid setting NAME: ...") and then calls `super().__post_init__()`, so every policy's checks run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the server's Settings imports the policies' settings, without torch
    from server.admission.tenants import Keys
    from server.memory.breaker import MemoryBreaker
    from server.metrics import Metrics


@dataclass(frozen=True, kw_only=True)
class PolicySettingsBase:
    """The root of the policies' settings: no field, and the end of their chain of `__post_init__` checks.
    Not slotted: the server's Settings inherits several of these, and slotted bases could not be combined."""

    def __post_init__(self) -> None:
        return None


def check_setting(ok: bool, name: str, message: str) -> None:
    """Raises the ValueError a bad setting is reported with (`invalid setting NAME: message`)."""
    if not ok:
        raise ValueError(f"invalid setting {name}: {message}")


@dataclass(slots=True)
class Serving:
    """Whether calls may be admitted at all: `ready` once the models are installed, `draining` from SIGTERM
    (server/app.py sets both through the interceptor; the Lifecycle policy reads them)."""

    ready: bool = False
    draining: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyContext:
    """The server's objects a policy may use; a policy's factory gets these and its own settings, never the
    server's whole Settings."""

    serving: Serving
    metrics: Metrics
    keys: Keys | None  # the tenants of --auth-keys; None: no authentication
    breaker: MemoryBreaker | None  # with one device; None: each model's DeviceGates skips open breakers
