"""RequestBytes: request bytes admitted and not yet answered, against a limit: what callers' tensors may hold
in the server at once (96 concurrent 4 MiB requests once raised its RSS by 319 MB that was never returned).
Taken by the deserializer before it parses, given back when the call ends, however it ends."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import TYPE_CHECKING

from process.flags import setting
from server.admission.policy import AdmissionPolicy
from server.admission.policy_context import PolicyContext, PolicySettingsBase, check_setting
from server.errors import Overloaded, SluiceError
from wire import errors as reasons

if TYPE_CHECKING:
    from server.admission.reader import GuardedMethod

# The bytes the current call holds of the budget (one task per call; set by the deserializer).
CALL_BYTES: contextvars.ContextVar[int] = contextvars.ContextVar("call_bytes", default=0)


@dataclass(frozen=True, kw_only=True)
class RequestBytesSettings(PolicySettingsBase):
    max_request_bytes_in_flight: int = setting(
        512 * 1024 * 1024,
        help="request bytes admitted and not yet answered; more are refused (RESOURCE_EXHAUSTED) unparsed",
        unit="bytes",
    )

    def __post_init__(self) -> None:
        check_setting(self.max_request_bytes_in_flight >= 1, "max_request_bytes_in_flight", "must be >= 1")
        super().__post_init__()


class RequestBytes(AdmissionPolicy):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    @classmethod
    def build(cls, settings: RequestBytesSettings, context: PolicyContext) -> RequestBytes:
        return cls(settings.max_request_bytes_in_flight)

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
