"""Every HTTP error the shim answers: one gRPC-code -> HTTP-status table and one body shape.

    ShimError(Exception)            carries an ErrorBody and the HTTP status it is sent with
    ├── from_rpc_error()            an upstream grpc.aio.AioRpcError, details decoded from
    │                               `grpc-status-details-bin` by clients.errors.decode_status_details
    ├── from_stream_error()         the ErrorStatus carried by a final GenerateResponse
    └── invalid_argument() / ...    the shim's own refusals (malformed JSON, too large, overloaded)

Every error body has the shape `{"error": {code, message, reason, domain, metadata, field_violations,
retry_after_s}}`, and a RetryInfo adds a `Retry-After` header in whole seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
from google.rpc import status_pb2
from grpc_status import rpc_status

from clients.errors import decode_status_details, status_code_from_number

SHIM_DOMAIN = "shim.sluice"
DETAILS_METADATA_KEY = "grpc-status-details-bin"

# The one table: canonical gRPC code -> HTTP status. REQUEST_TOO_LARGE refines RESOURCE_EXHAUSTED to 413.
HTTP_STATUS_BY_CODE: Mapping[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
_REASON_STATUS_OVERRIDES: Mapping[tuple[grpc.StatusCode, str], int] = {
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "REQUEST_TOO_LARGE"): 413,
}


def http_status_for(code: grpc.StatusCode, reason: str | None = None) -> int:
    """The HTTP status for a canonical code, refined by the ErrorInfo reason where the table says so."""
    if reason is not None and (code, reason) in _REASON_STATUS_OVERRIDES:
        return _REASON_STATUS_OVERRIDES[(code, reason)]
    return HTTP_STATUS_BY_CODE.get(code, 500)


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One bad field: `field` is the name the HTTP caller used, `proto_field` the server's path."""

    field: str
    description: str
    proto_field: str | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"field": self.field, "description": self.description}
        if self.proto_field is not None:
            body["proto_field"] = self.proto_field
        return body


@dataclass(frozen=True, slots=True)
class ErrorBody:
    """The JSON error object shared by HTTP error responses and SSE terminal events."""

    code: grpc.StatusCode
    message: str
    reason: str | None = None
    domain: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    field_violations: tuple[FieldViolation, ...] = ()
    retry_after_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code.name,
            "message": self.message,
            "reason": self.reason,
            "domain": self.domain,
            "metadata": dict(self.metadata),
            "field_violations": [violation.to_json() for violation in self.field_violations],
            "retry_after_s": self.retry_after_s,
        }


class ShimError(Exception):
    """An error answered to the HTTP caller with `status` and the `{"error": ...}` body."""

    def __init__(self, body: ErrorBody, *, status: int | None = None) -> None:
        super().__init__(body.message)
        self.body = body
        self.status = status if status is not None else http_status_for(body.code, body.reason)

    @property
    def headers(self) -> dict[str, str]:
        if self.body.retry_after_s is None:
            return {}
        # Retry-After takes whole seconds; rounding down could invite a retry that is refused again.
        return {"Retry-After": str(max(1, math.ceil(self.body.retry_after_s)))}

    def to_json(self) -> dict[str, Any]:
        return {"error": self.body.to_json()}


def _rich_status(exc: grpc.aio.AioRpcError) -> status_pb2.Status | None:
    try:
        found: status_pb2.Status | None = rpc_status.from_call(exc)  # type: ignore[arg-type]
        return found
    except ValueError:
        # from_call rejects a Status whose message differs from the call's details; the details
        # (reason, RetryInfo, field violations) are still worth more than dropping them.
        # grpc-stubs type aio metadata as the sync API's; at runtime it yields (key, value) pairs.
        metadata = cast("Iterable[tuple[str, str | bytes]]", exc.trailing_metadata() or ())
        for key, value in metadata:
            if key == DETAILS_METADATA_KEY and isinstance(value, bytes):
                return status_pb2.Status.FromString(value)
        return None


def from_rpc_error(exc: grpc.aio.AioRpcError, *, json_field: Callable[[str], str] = str) -> ShimError:
    """Maps a failed upstream call to the HTTP error the caller sees; `json_field` renames proto paths."""
    details = decode_status_details(_rich_status(exc))
    body = ErrorBody(
        code=exc.code(),
        message=exc.details() or "",
        reason=details.reason,
        domain=details.domain,
        metadata=details.metadata,
        field_violations=tuple(
            FieldViolation(json_field(path), description, proto_field=path)
            for path, description in details.field_violations
        ),
        retry_after_s=details.retry_after,
    )
    return ShimError(body)


def from_stream_error(code_number: int, message: str, reason: str) -> ErrorBody:
    """The error body for the ErrorStatus a GenerateResponse carries when a generation ended badly."""
    return ErrorBody(code=status_code_from_number(code_number), message=message, reason=reason or None)


def invalid_argument(
    message: str,
    *,
    reason: str,
    violations: tuple[FieldViolation, ...] = (),
    status: int = 400,
) -> ShimError:
    """The shim's own refusal of a request it could not read or translate."""
    body = ErrorBody(
        code=grpc.StatusCode.INVALID_ARGUMENT,
        message=message,
        reason=reason,
        domain=SHIM_DOMAIN,
        field_violations=violations,
    )
    return ShimError(body, status=status)


def request_too_large(limit: int) -> ShimError:
    """A body over max_body_bytes, refused before (or while) reading it."""
    body = ErrorBody(
        code=grpc.StatusCode.RESOURCE_EXHAUSTED,
        message=f"request body exceeds {limit} bytes",
        reason="REQUEST_TOO_LARGE",
        domain=SHIM_DOMAIN,
        metadata={"limit_bytes": str(limit)},
    )
    return ShimError(body)


def shim_overloaded(limit: int) -> ShimError:
    """The shim's own in-flight bound is reached; the caller should retry shortly."""
    body = ErrorBody(
        code=grpc.StatusCode.UNAVAILABLE,
        message=f"the shim is serving its limit of {limit} requests; retry shortly",
        reason="SHIM_OVERLOADED",
        domain=SHIM_DOMAIN,
        metadata={"max_inflight": str(limit)},
        retry_after_s=1.0,
    )
    return ShimError(body)


def upstream_protocol_error(message: str) -> ShimError:
    """The upstream broke the contract, e.g. ended a generation without a final message."""
    body = ErrorBody(
        code=grpc.StatusCode.INTERNAL, message=message, reason="UPSTREAM_PROTOCOL_ERROR", domain=SHIM_DOMAIN
    )
    return ShimError(body)
