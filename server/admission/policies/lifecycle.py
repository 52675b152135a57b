"""Lifecycle: no call is admitted while the server loads and warms its models, or once it drains."""

from __future__ import annotations

from server.admission.policy import AdmissionPolicy
from server.admission.reader import GuardedMethod
from server.errors import NotReady, ShuttingDown, SluiceError


class Lifecycle(AdmissionPolicy):
    """`ready` is set once the models are installed; `draining` on SIGTERM (server/app.py)."""

    def __init__(self) -> None:
        self.ready = False
        self.draining = False

    def check(self, method: GuardedMethod, model: str) -> SluiceError | None:
        if self.draining:
            return ShuttingDown("the server is draining; retry on another replica", retry_after_s=1.0)
        if not self.ready:
            return NotReady("the server is loading and warming up its models", retry_after_s=1.0)
        return None
