"""Lifecycle: no call is admitted while the server loads and warms its models, or once it drains."""

from __future__ import annotations

from typing import TYPE_CHECKING

from server.admission.policy import AdmissionPolicy
from server.admission.policy_context import PolicyContext, Serving
from server.errors import NotReady, ShuttingDown, SluiceError

if TYPE_CHECKING:
    from server.admission.reader import GuardedMethod


class Lifecycle(AdmissionPolicy):
    """Reads the server's Serving state: `ready` is set once the models are installed, `draining` on SIGTERM
    (server/app.py)."""

    def __init__(self, serving: Serving | None = None) -> None:
        self.serving = serving or Serving()

    @classmethod
    def build(cls, settings: object, context: PolicyContext) -> Lifecycle:
        return cls(context.serving)

    def check(self, method: GuardedMethod, model: str) -> SluiceError | None:
        if self.serving.draining:
            return ShuttingDown("the server is draining; retry on another replica", retry_after_s=1.0)
        if not self.serving.ready:
            return NotReady("the server is loading and warming up its models", retry_after_s=1.0)
        return None
