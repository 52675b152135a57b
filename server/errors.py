"""The domain error tree. Runtimes and batchers raise these; server/codec/status.py maps them to gRPC.

SluiceError                      code                 reason
├── InvalidArgument              INVALID_ARGUMENT     INVALID_ARGUMENT (+ BadRequest field violations)
│   └── LimitExceeded            INVALID_ARGUMENT     LIMIT_EXCEEDED
├── ModelNotFound                NOT_FOUND            MODEL_NOT_FOUND
├── WrongMethod                  FAILED_PRECONDITION  WRONG_METHOD        (the model is served by another RPC)
├── RequestTooLarge              RESOURCE_EXHAUSTED   REQUEST_TOO_LARGE
├── Overloaded                   RESOURCE_EXHAUSTED   QUEUE_FULL          (+ RetryInfo)
├── OutOfMemory                  RESOURCE_EXHAUSTED   OUT_OF_MEMORY       (+ RetryInfo)
├── MemoryPressure               UNAVAILABLE          MEMORY_PRESSURE     (+ RetryInfo)
├── ShuttingDown                 UNAVAILABLE          SHUTTING_DOWN       (+ RetryInfo)
├── NotReady                     UNAVAILABLE          NOT_READY           (+ RetryInfo)
├── DeadlineExpired              DEADLINE_EXCEEDED    DEADLINE_EXPIRED
├── DeadlineUnmeetable           DEADLINE_EXCEEDED    DEADLINE_UNMEETABLE
├── StalledConsumer              CANCELLED            STALLED_CONSUMER
├── Unauthenticated              UNAUTHENTICATED      UNAUTHENTICATED     (no token, or an unknown one)
├── PermissionDenied             PERMISSION_DENIED    MODEL_NOT_ALLOWED   (the tenant may not call that model)
│                                                     SHM_NOT_LOCAL, SHM_KEY_NOT_ALLOWED (shared memory)
├── TenantQuota                  RESOURCE_EXHAUSTED   TENANT_QUOTA        (+ RetryInfo: its share or its rate)
│                                                     SHM_QUOTA           (its shared-memory regions)
├── FeatureOff                   UNIMPLEMENTED        FEATURE_OFF         (a part not started: --kserve-shm)
├── ModelFailure                 INTERNAL             MODEL_ERROR
└── ConstraintFailed             INTERNAL             CONSTRAINT_FAILED   (a grammar's matcher failed mid-way)
    └── ConstraintTooComplex     INVALID_ARGUMENT     CONSTRAINT_TOO_COMPLEX  (a per-step limit outgrown)

Errors echo what the caller sent (a model name, an input name) only through `clip`, and every metadata value
is clipped too: an 8,000-character model name must not become 24 KB of trailers, over gRPC's limit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from wire import errors as reasons
from wire.errors import ECHO_LIMIT, clip

__all__ = ["ECHO_LIMIT", "clip"]  # with the error tree below: the clip rule is the wire contract's

_METADATA_LIMIT = 256


class SluiceError(Exception):
    """Base of every error a caller may see; `code` is a canonical gRPC status name."""

    code = "INTERNAL"
    reason = reasons.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        metadata: Mapping[str, object] | None = None,
        retry_after_s: float | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.metadata = {k: clip(v, _METADATA_LIMIT) for k, v in (metadata or {}).items()}
        self.retry_after_s = retry_after_s
        if reason is not None:
            self.reason = reason


class InvalidArgument(SluiceError):
    code = "INVALID_ARGUMENT"
    reason = reasons.INVALID_ARGUMENT

    def __init__(
        self,
        message: str,
        *,
        field: str,
        violations: Sequence[tuple[str, str]] | None = None,
        metadata: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message, metadata={"field": field, **(metadata or {})})
        self.field = field
        self.violations: list[tuple[str, str]] = list(violations or [(field, message)])


class LimitExceeded(InvalidArgument):
    reason = reasons.LIMIT_EXCEEDED


class ModelNotFound(SluiceError):
    code = "NOT_FOUND"
    reason = reasons.MODEL_NOT_FOUND

    def __init__(self, model: str, available: Sequence[str]) -> None:
        super().__init__(
            f"model {clip(model)!r} is not loaded; available: {', '.join(sorted(available)) or 'none'}",
            metadata={"model": clip(model)},
        )


class WrongMethod(SluiceError):
    code = "FAILED_PRECONDITION"
    reason = reasons.WRONG_METHOD

    def __init__(self, model: str, called: str, serving: str) -> None:
        super().__init__(
            f"model {model!r} is served by {serving}, not {called}; call {serving}",
            metadata={"model": model, "method": called, "serving_method": serving},
        )


class RequestTooLarge(SluiceError):
    code = "RESOURCE_EXHAUSTED"
    reason = reasons.REQUEST_TOO_LARGE


class Overloaded(SluiceError):
    code = "RESOURCE_EXHAUSTED"
    reason = reasons.QUEUE_FULL


class OutOfMemory(SluiceError):
    code = "RESOURCE_EXHAUSTED"
    reason = reasons.OUT_OF_MEMORY


class MemoryPressure(SluiceError):
    code = "UNAVAILABLE"
    reason = reasons.MEMORY_PRESSURE


class ShuttingDown(SluiceError):
    code = "UNAVAILABLE"
    reason = reasons.SHUTTING_DOWN


class NotReady(SluiceError):
    code = "UNAVAILABLE"
    reason = reasons.NOT_READY


class DeadlineExpired(SluiceError):
    code = "DEADLINE_EXCEEDED"
    reason = reasons.DEADLINE_EXPIRED


class DeadlineUnmeetable(SluiceError):
    code = "DEADLINE_EXCEEDED"
    reason = reasons.DEADLINE_UNMEETABLE


class StalledConsumer(SluiceError):
    code = "CANCELLED"
    reason = reasons.STALLED_CONSUMER


class Unauthenticated(SluiceError):
    code = "UNAUTHENTICATED"
    reason = reasons.UNAUTHENTICATED


class PermissionDenied(SluiceError):
    code = "PERMISSION_DENIED"
    reason = reasons.MODEL_NOT_ALLOWED


class TenantQuota(SluiceError):
    code = "RESOURCE_EXHAUSTED"
    reason = reasons.TENANT_QUOTA


class FeatureOff(SluiceError):
    code = "UNIMPLEMENTED"
    reason = reasons.FEATURE_OFF


class ModelFailure(SluiceError):
    code = "INTERNAL"
    reason = reasons.MODEL_ERROR


class ConstraintFailed(SluiceError):
    """A stream's grammar matcher failed after output began (sent in-band, ending the stream): a token it
    could not take, or an error of its own."""

    code = "INTERNAL"
    reason = reasons.CONSTRAINT_FAILED


class ConstraintTooComplex(ConstraintFailed):
    """The grammar outgrew one of llguidance's per-step limits at this point of the output (Earley items
    per row, lexer fuel): the request's constraint, not the server, is at fault, and a retry fails alike."""

    code = "INVALID_ARGUMENT"
    reason = reasons.CONSTRAINT_TOO_COMPLEX
