"""MemoryGuard: while the memory breaker is open (one device), calls are refused before they are parsed.
With several devices each model's DeviceGates skips the devices whose breaker is open instead."""

from __future__ import annotations

from server.admission.policy import AdmissionPolicy
from server.admission.reader import GuardedMethod
from server.errors import SluiceError
from server.memory.breaker import MemoryBreaker


class MemoryGuard(AdmissionPolicy):
    def __init__(self, breaker: MemoryBreaker) -> None:
        self.breaker = breaker

    def check(self, method: GuardedMethod, model: str) -> SluiceError | None:
        return self.breaker.refusal() if self.breaker.is_open else None
