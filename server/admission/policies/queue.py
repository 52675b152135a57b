"""QueueBound: a call whose model has every slot held and its wait queue at its bound is refused QUEUE_FULL
(with a retry hint from the drain rate) before it is parsed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from server.admission.policy import AdmissionPolicy
from server.errors import SluiceError

if TYPE_CHECKING:
    from server.admission.reader import GuardedMethod


class QueueBound(AdmissionPolicy):
    def check(self, method: GuardedMethod, model: str) -> SluiceError | None:
        gate = method.gates[model]  # KnownModel ran first
        return gate.overloaded() if gate.is_full() else None
