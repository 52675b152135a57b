"""QueueBound: a call whose model has every slot held and its wait queue at its bound is refused QUEUE_FULL
(with a retry hint from the drain rate) before it is parsed."""

from __future__ import annotations

from server.admission.policy import AdmissionPolicy
from server.admission.reader import GuardedMethod
from server.errors import SluiceError


class QueueBound(AdmissionPolicy):
    def check(self, method: GuardedMethod, model: str) -> SluiceError | None:
        gate = method.gates[model]  # KnownModel ran first
        return gate.overloaded() if gate.is_full() else None
