"""MemoryGuard: while the memory breaker is open (one device), calls are refused before they are parsed.
With several devices each model's DeviceGates skips the devices whose breaker is open instead."""

from __future__ import annotations

from typing import TYPE_CHECKING

from server.admission.policy import AdmissionPolicy
from server.admission.policy_context import PolicyContext
from server.errors import SluiceError

if TYPE_CHECKING:
    from server.admission.reader import GuardedMethod
    from server.memory.breaker import MemoryBreaker


class MemoryGuard(AdmissionPolicy):
    def __init__(self, breaker: MemoryBreaker) -> None:
        self.breaker = breaker

    @classmethod
    def build(cls, settings: object, context: PolicyContext) -> MemoryGuard | None:
        return cls(context.breaker) if context.breaker is not None else None

    def check(self, method: GuardedMethod, model: str) -> SluiceError | None:
        return self.breaker.refusal() if self.breaker.is_open else None
