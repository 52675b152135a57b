"""AdmissionPolicy: one admission rule, and Policies, the ordered list the interceptor runs.

A policy acts at up to three points of a call, each before the next one costs anything:

- `screen(path, metadata)`: on the call's metadata alone, before its bytes are read (authentication);
- `check(method, model)`: on the model the raw request names, before it is parsed (draining, readiness,
  the model, a tenant's models, the memory breaker, the queue bound); `weigh(size)` for a policy that
  needs only the request's size (the byte budget), which runs even when the bytes name no model;
- `hold(admission)`: on the parsed request, before it queues: it may lower the priority, and returns
  what to give back with the slot (a tenant's share and rate), or raises the refusal;
- `prompt(model, spec, tokens)`: on the prompt's token count, where the tokenizer is: the Generate
  scheduler calls it once it has tokenized the prompt, before the stream starts (admission cannot tokenize:
  it never imports the runtimes). Only what needs the count waits until then.

`settle(admission, error)` hears how a parsed call's admission ended (None: admitted; else the refusal),
and `finish()` runs as every call ends, refused or not. The first policy that refuses decides; the rest never
run. Each hook is optional: Policies keeps, per hook, only the policies that override it.

A policy is built by its class's `build(settings, context)` (server/admission/policy_context.py): from the
settings it declares and the server's objects; the registered list is server/admission/policies/__init__.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from server.errors import SluiceError

if TYPE_CHECKING:  # names in annotations only: the policies' settings are read by the server's Settings,
    # which front-end processes import without torch (server/memory/ imports it)
    from server.admission.devices import DeviceGates
    from server.admission.gate import AdmissionGate
    from server.admission.policy_context import PolicyContext
    from server.admission.reader import GuardedMethod
    from server.domain import GenerateSpec
    from server.priority import Priority

Release = Callable[[], None]
PromptCheck = Callable[[str, "GenerateSpec", int], "SluiceError | None"]


@dataclass(slots=True)
class Admission:
    """One parsed call on its way into its model's gate."""

    request: Any
    method: GuardedMethod
    model: str
    gate: AdmissionGate | DeviceGates
    priority: Priority


class AdmissionPolicy:
    """The base: every hook admits. A policy overrides the hooks it needs."""

    @classmethod
    def build(cls, settings: Any, context: PolicyContext) -> AdmissionPolicy | None:
        """The policy as the server runs it, from the settings it declares (the server's Settings, which
        inherits them) and the server's objects; None where its settings leave it out. By default: cls()."""
        return cls()

    def screen(self, path: str, metadata: Mapping[str, str]) -> SluiceError | None:
        return None

    def check(self, method: GuardedMethod, model: str) -> SluiceError | None:
        return None

    def weigh(self, method: GuardedMethod, model: str | None, size: int) -> SluiceError | None:
        return None

    def hold(self, admission: Admission) -> Release | None:
        return None

    def settle(self, admission: Admission, error: SluiceError | None) -> None:
        return None

    def finish(self) -> None:
        return None

    def prompt(self, model: str, spec: GenerateSpec, tokens: int) -> SluiceError | None:
        return None


def _overriding(policies: Sequence[AdmissionPolicy], hook: str) -> list[Any]:
    base = getattr(AdmissionPolicy, hook)
    return [getattr(p, hook) for p in policies if getattr(type(p), hook) is not base]


class Policies:
    """The ordered list, with each hook's overriding policies resolved once (not per call)."""

    def __init__(self, policies: Sequence[AdmissionPolicy]) -> None:
        self.policies = tuple(policies)
        self._screens: list[Callable[[str, Mapping[str, str]], SluiceError | None]]
        self._screens = _overriding(self.policies, "screen")
        self._checks: list[Callable[[GuardedMethod, str], SluiceError | None]]
        self._checks = _overriding(self.policies, "check")
        self._weighs: list[Callable[[GuardedMethod, str | None, int], SluiceError | None]]
        self._weighs = _overriding(self.policies, "weigh")
        self._holds: list[Callable[[Admission], Release | None]] = _overriding(self.policies, "hold")
        self._settles: list[Callable[[Admission, SluiceError | None], None]]
        self._settles = _overriding(self.policies, "settle")
        self._finishes: list[Callable[[], None]] = _overriding(self.policies, "finish")
        self._prompts: list[PromptCheck] = _overriding(self.policies, "prompt")

    @property
    def screens(self) -> bool:
        return bool(self._screens)

    def screen(self, path: str, metadata: Mapping[str, str]) -> SluiceError | None:
        for screen in self._screens:
            if (error := screen(path, metadata)) is not None:
                return error
        return None

    def check(self, method: GuardedMethod, model: str) -> SluiceError | None:
        for check in self._checks:
            if (error := check(method, model)) is not None:
                return error
        return None

    def weigh(self, method: GuardedMethod, model: str | None, size: int) -> SluiceError | None:
        for weigh in self._weighs:
            if (error := weigh(method, model, size)) is not None:
                return error
        return None

    def hold(self, admission: Admission) -> list[Release]:
        """What to give back with the slot; on a refusal, what was already taken is given back first."""
        releases: list[Release] = []
        try:
            for hold in self._holds:
                if (release := hold(admission)) is not None:
                    releases.append(release)
        except SluiceError:
            for release in reversed(releases):
                release()
            raise
        return releases

    def settle(self, admission: Admission, error: SluiceError | None) -> None:
        for settle in self._settles:
            settle(admission, error)

    def finish(self) -> None:
        for finish in self._finishes:
            finish()

    @property
    def prompt_check(self) -> PromptCheck | None:
        """What the Generate scheduler runs on a tokenized prompt; None when no policy needs the count."""
        return self._prompt if self._prompts else None

    def _prompt(self, model: str, spec: GenerateSpec, tokens: int) -> SluiceError | None:
        for prompt in self._prompts:
            if (error := prompt(model, spec, tokens)) is not None:
                return error
        return None

    def find(self, kind: type[Any]) -> Any:
        """The policy of that class in the list, or None."""
        return next((p for p in self.policies if isinstance(p, kind)), None)
