"""KnownModel: a call names a model this RPC serves; one the other RPC serves says which RPC is right."""

from __future__ import annotations

from typing import TYPE_CHECKING

from server.admission.policy import AdmissionPolicy
from server.errors import InvalidArgument, ModelNotFound, SluiceError, WrongMethod

if TYPE_CHECKING:
    from server.admission.reader import GuardedMethod


class KnownModel(AdmissionPolicy):
    def check(self, method: GuardedMethod, model: str) -> SluiceError | None:
        if not model:
            return InvalidArgument("model must be set", field="model")
        if model in method.gates:
            return None
        serving = method.elsewhere.get(model)
        if serving is not None:
            return WrongMethod(model, method.name, serving)
        return ModelNotFound(model, sorted(method.gates))
