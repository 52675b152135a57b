"""RequestBytes: request bytes admitted and not yet answered, against a limit: what callers' tensors may hold
in the server at once (96 concurrent 4 MiB requests once raised its RSS by 319 MB that was never returned).
Taken by the deserializer before it parses, given back when the call ends, however it ends."""

from __future__ import annotations

import contextvars

from server.admission.policy import AdmissionPolicy
from server.admission.reader import GuardedMethod
from server.errors import Overloaded, SluiceError
from wire import errors as reasons

# The bytes the current call holds of the budget (one task per call; set by the deserializer).
CALL_BYTES: contextvars.ContextVar[int] = contextvars.ContextVar("call_bytes", default=0)


class RequestBytes(AdmissionPolicy):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def weigh(self, method: GuardedMethod, model: str | None, size: int) -> SluiceError | None:
        if self.in_flight + size > self.limit and self.in_flight > 0:  # one call alone always fits
            return Overloaded(
                f"{self.in_flight} request bytes in flight; {size} more would pass the {self.limit} limit",
                reason=reasons.REQUEST_BYTES,
                retry_after_s=0.1,
                metadata={"limit": self.limit, "in_flight": self.in_flight},
            )
        self.in_flight += size
        CALL_BYTES.set(size)
        return None

    def finish(self) -> None:
        self.in_flight -= CALL_BYTES.get()
        CALL_BYTES.set(0)
