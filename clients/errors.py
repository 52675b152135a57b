"""Typed client exceptions, and the one function that maps a gRPC error onto them.

Every failed call raises a `SluiceError` subclass chosen by the canonical status code, carrying the
`google.rpc` details the server attached (AIP-193)::

    SluiceError                    any other code (UNIMPLEMENTED, FAILED_PRECONDITION, UNKNOWN, ...)
    ├── InvalidArgumentError       INVALID_ARGUMENT  (field_violations from google.rpc.BadRequest)
    ├── UnauthenticatedError       UNAUTHENTICATED   (no token, or one the server does not know)
    ├── PermissionDeniedError      PERMISSION_DENIED (the token's tenant may not call that model)
    ├── NotFoundError              NOT_FOUND
    ├── ResourceExhaustedError     RESOURCE_EXHAUSTED (retry_after from google.rpc.RetryInfo)
    ├── UnavailableError           UNAVAILABLE
    ├── DeadlineExceededError      DEADLINE_EXCEEDED
    ├── RequestCancelledError      CANCELLED
    └── InternalError              INTERNAL
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

__all__ = [
    "DeadlineExceededError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "RequestCancelledError",
    "ResourceExhaustedError",
    "SluiceError",
    "StatusDetails",
    "UnauthenticatedError",
    "UnavailableError",
    "decode_status_details",
    "error_from_rpc",
    "error_from_status",
    "rich_status_of",
    "status_code_from_number",
    "status_details_of",
    "typed_errors",
]


class SluiceError(Exception):
    """A call failed with a non-OK gRPC status; the attributes hold the status and its details."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str | None = None,
        domain: str | None = None,
        metadata: dict[str, str] | None = None,
        retry_after: float | None = None,
        field_violations: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata: dict[str, str] = dict(metadata or {})
        self.retry_after = retry_after
        self.field_violations: list[tuple[str, str]] = list(field_violations or [])

    def __str__(self) -> str:
        label = self.code.name + (f"/{self.reason}" if self.reason else "")
        return f"{label}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code.name}, reason={self.reason!r}, message={self.message!r})"
        )


class InvalidArgumentError(SluiceError):
    """The request was malformed; `field_violations` lists the offending fields."""


class UnauthenticatedError(SluiceError):
    """The server wants a valid token (`token=` on the client)."""


class PermissionDeniedError(SluiceError):
    """The token's tenant may not make this call."""


class NotFoundError(SluiceError):
    """The named model does not exist on the server."""


class ResourceExhaustedError(SluiceError):
    """The server is overloaded or a quota was hit; `retry_after` says when to try again."""


class UnavailableError(SluiceError):
    """The server could not be reached or is draining; safe unary calls were already retried."""


class DeadlineExceededError(SluiceError):
    """The call's deadline passed before it completed."""


class RequestCancelledError(SluiceError):
    """The call was cancelled; named so that it does not shadow `asyncio.CancelledError`."""


class InternalError(SluiceError):
    """The server hit a bug or an unexpected failure."""


_BY_CODE: dict[grpc.StatusCode, type[SluiceError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: RequestCancelledError,
    grpc.StatusCode.INTERNAL: InternalError,
}

_CODE_BY_NUMBER: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def status_code_from_number(number: int) -> grpc.StatusCode:
    """The `grpc.StatusCode` for a canonical code number; unknown numbers read as UNKNOWN."""
    return _CODE_BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)


@dataclass(frozen=True, slots=True)
class StatusDetails:
    """The google.rpc details of a failed call (ErrorInfo, RetryInfo, BadRequest), as plain values."""

    reason: str | None = None
    domain: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    retry_after: float | None = None
    # (field path as the server names it, description) per google.rpc.BadRequest field violation.
    field_violations: tuple[tuple[str, str], ...] = ()


def decode_status_details(rich: status_pb2.Status | None) -> StatusDetails:
    """Unpack ErrorInfo, RetryInfo and BadRequest from a rich status; absent details stay empty."""
    reason: str | None = None
    domain: str | None = None
    metadata: dict[str, str] = {}
    retry_after: float | None = None
    violations: list[tuple[str, str]] = []
    for detail in rich.details if rich is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, domain, metadata = info.reason or None, info.domain or None, dict(info.metadata)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_after = retry.retry_delay.ToTimedelta().total_seconds()
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations.extend((v.field, v.description) for v in bad.field_violations)
    return StatusDetails(
        reason=reason,
        domain=domain,
        metadata=metadata,
        retry_after=retry_after,
        field_violations=tuple(violations),
    )


def error_from_status(code: grpc.StatusCode, message: str, rich: status_pb2.Status | None) -> SluiceError:
    """Build the typed exception for `code`, unpacking ErrorInfo, RetryInfo and BadRequest from `rich`."""
    details = decode_status_details(rich)
    cls = _BY_CODE.get(code, SluiceError)
    return cls(
        code,
        message,
        reason=details.reason,
        domain=details.domain,
        metadata=details.metadata,
        retry_after=details.retry_after,
        field_violations=list(details.field_violations),
    )


_DETAILS_KEY = "grpc-status-details-bin"


def rich_status_of(exc: grpc.RpcError) -> status_pb2.Status | None:
    """The google.rpc Status a failed sync or aio call carries in its `grpc-status-details-bin` trailer.

    The transport's code and message stay authoritative. Details whose code disagrees with the call's
    describe another failure and are dropped; a message that differs (a proxy rewrote it) keeps them,
    since the reason, RetryInfo and field violations still hold. A trailer that does not parse is None.
    """
    # Sync errors are grpc.Call objects; AioRpcError is not, but has the same synchronous methods.
    call = cast(grpc.Call, exc)
    # grpc-stubs type aio metadata as the sync API's; at runtime both yield (key, value) pairs.
    for key, value in cast("Iterable[tuple[str, str | bytes]]", call.trailing_metadata() or ()):
        if key != _DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            rich = status_pb2.Status.FromString(value)
        except DecodeError:
            return None
        return rich if rich.code == call.code().value[0] else None
    return None


def status_details_of(exc: grpc.RpcError) -> StatusDetails:
    """The decoded google.rpc details of a failed call (empty where it carries none)."""
    return decode_status_details(rich_status_of(exc))


def error_from_rpc(exc: grpc.RpcError) -> SluiceError:
    """Map a failed sync or aio call (`grpc.RpcError`, `grpc.aio.AioRpcError`) to its typed exception."""
    call = cast(grpc.Call, exc)
    return error_from_status(call.code(), call.details() or "", rich_status_of(exc))


@contextmanager
def typed_errors() -> Iterator[None]:
    """Re-raise any `grpc.RpcError` inside the block as its typed exception, chained `from` it.

    A plain context manager, so the sync and asyncio clients share it (`with` works inside coroutines).
    """
    try:
        yield
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from exc
